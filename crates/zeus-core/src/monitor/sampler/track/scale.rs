//! [`ScaleLog`]: the recent errors of one kind with their robust scale kept current.
//!
//! The sampler thread adds an error at most once per counter read; window edges ask for the
//! scales several times each, hundreds of thousands of times a second in a tight loop of
//! windows. So the scale is computed where an error comes, not where it is asked for.

use std::collections::VecDeque;

/// Something with a size whose scale is taken.
pub(super) trait Magnitude: Copy {
    fn magnitude(&self) -> f64;
}

impl Magnitude for f64 {
    fn magnitude(&self) -> f64 {
        self.abs()
    }
}

/// The last `cap` values and their [`robust_scale`].
#[derive(Debug, Clone)]
pub(super) struct ScaleLog<T> {
    values: VecDeque<T>,
    cap: usize,
    scale: Option<f64>,
}

impl<T: Magnitude> ScaleLog<T> {
    pub(super) fn new(cap: usize) -> Self {
        ScaleLog {
            values: VecDeque::with_capacity(cap + 1),
            cap,
            scale: None,
        }
    }

    /// Add `x`, dropping the oldest beyond the cap.
    pub(super) fn push(&mut self, x: T) {
        self.values.push_back(x);
        while self.values.len() > self.cap {
            self.values.pop_front();
        }
        self.scale = robust_scale(self.values.iter().map(Magnitude::magnitude));
    }

    pub(super) fn clear(&mut self) {
        self.values.clear();
        self.scale = None;
    }

    /// The scale of the values held (`None` below three).
    pub(super) fn scale(&self) -> Option<f64> {
        self.scale
    }

    pub(super) fn len(&self) -> usize {
        self.values.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.values.iter()
    }
}

/// The scale (a standard deviation) of errors: their 95th percentile over 1.96, so that a
/// bound of [`super::Z95`] scales covers 95% of them whatever the shape of their tail (a load
/// that moves between readings gives heavy ones), while a single stray value among two dozen
/// (a start-up glitch) does not widen every bound. `None` below three values.
pub(super) fn robust_scale(magnitudes: impl Iterator<Item = f64>) -> Option<f64> {
    let mut a: Vec<f64> = magnitudes.collect();
    if a.len() < 3 {
        return None;
    }
    a.sort_by(f64::total_cmp);
    let q95 = a[((a.len() as f64 * 0.95).ceil() as usize).min(a.len()) - 1];
    let second = a[a.len().saturating_sub(2)];
    Some(q95.min(second) / 1.96)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The kept scale is always the scale of the values held, whatever was pushed and
        /// cleared before.
        #[test]
        fn the_kept_scale_is_the_scale_of_the_values_held(
            xs in prop::collection::vec(-1e3f64..1e3, 0..80),
            clear_at in prop::option::of(0usize..80),
            cap in 1usize..30,
        ) {
            let mut log = ScaleLog::new(cap);
            for (i, &x) in xs.iter().enumerate() {
                if clear_at == Some(i) {
                    log.clear();
                }
                log.push(x);
                prop_assert!(log.len() <= cap);
                let want = robust_scale(log.iter().map(|v| v.abs()));
                prop_assert_eq!(log.scale(), want);
            }
        }
    }

    #[test]
    fn the_scale_is_the_95th_percentile_or_the_second_largest_over_1_96() {
        assert_eq!(robust_scale([1.0, 2.0].into_iter()), None);
        // Three values: the second largest (2) is below the 95th percentile (3).
        assert_eq!(robust_scale([3.0, -1.0, 2.0].into_iter()), Some(2.0 / 1.96));
        // 40 values 1..40: the 95th percentile is the 38th, below the second largest (39).
        let v = (1..=40).map(f64::from);
        assert_eq!(robust_scale(v), Some(38.0 / 1.96));
    }
}
