//! A bounded, time-ordered power timeline: a ring buffer holding one timestamp (f64 seconds)
//! and one power reading per GPU (u32 milliwatts) per sample, i.e. `8 / n + 4` bytes per sample
//! per GPU. When full, the oldest samples are overwritten.

/// Power samples of a fixed set of GPUs, oldest first.
#[derive(Debug, Clone)]
pub struct Timeline {
    n_gpus: usize,
    capacity: usize,
    times: Vec<f64>,
    /// Row-major: sample `k` occupies `powers[k * n_gpus .. (k + 1) * n_gpus]` (ring slots).
    powers: Vec<u32>,
    /// Ring slot of the oldest sample.
    head: usize,
    len: usize,
}

impl Timeline {
    /// An empty timeline for `n_gpus` GPUs keeping at most `capacity` samples (both >= 1).
    pub fn new(n_gpus: usize, capacity: usize) -> Timeline {
        assert!(
            n_gpus >= 1 && capacity >= 1,
            "a timeline needs a GPU and room for a sample"
        );
        Timeline {
            n_gpus,
            capacity,
            times: Vec::new(),
            powers: Vec::new(),
            head: 0,
            len: 0,
        }
    }

    pub fn n_gpus(&self) -> usize {
        self.n_gpus
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of sample storage per sample per GPU.
    pub fn bytes_per_sample_per_gpu(&self) -> f64 {
        (std::mem::size_of::<f64>() as f64 + (self.n_gpus * std::mem::size_of::<u32>()) as f64)
            / self.n_gpus as f64
    }

    /// Bytes currently allocated for samples.
    pub fn allocated_bytes(&self) -> usize {
        self.times.capacity() * std::mem::size_of::<f64>()
            + self.powers.capacity() * std::mem::size_of::<u32>()
    }

    #[inline]
    fn slot(&self, i: usize) -> usize {
        let s = self.head + i;
        if s >= self.capacity {
            s - self.capacity
        } else {
            s
        }
    }

    /// Timestamp of the `i`-th oldest sample.
    #[inline]
    pub fn time(&self, i: usize) -> f64 {
        self.times[self.slot(i)]
    }

    /// Power (mW) of GPU column `g` in the `i`-th oldest sample.
    #[inline]
    pub fn power_mw(&self, i: usize, g: usize) -> u32 {
        self.powers[self.slot(i) * self.n_gpus + g]
    }

    pub fn last_time(&self) -> Option<f64> {
        (self.len > 0).then(|| self.time(self.len - 1))
    }

    /// Append a sample. Timestamps must increase: a sample not later than the last one is
    /// dropped (returns `false`), which keeps the timeline sorted when a background thread and
    /// `sample_now` race, and ignores repeated reads while a virtual clock stands still.
    pub fn push(&mut self, t: f64, powers_mw: &[u32]) -> bool {
        assert_eq!(powers_mw.len(), self.n_gpus, "one power reading per GPU");
        if !t.is_finite() || self.last_time().is_some_and(|last| t <= last) {
            return false;
        }
        if self.len < self.capacity {
            // Still filling: slots are in order from 0 (head stays 0 until the ring wraps).
            // Grow geometrically but never past `capacity`, so memory stays within bounds.
            if self.times.len() == self.times.capacity() {
                let extra = self.len.max(64).min(self.capacity - self.len);
                self.times.reserve_exact(extra);
                self.powers.reserve_exact(extra * self.n_gpus);
            }
            self.times.push(t);
            self.powers.extend_from_slice(powers_mw);
            self.len += 1;
        } else {
            let s = self.head;
            self.times[s] = t;
            self.powers[s * self.n_gpus..(s + 1) * self.n_gpus].copy_from_slice(powers_mw);
            self.head = self.slot(1);
        }
        true
    }

    /// Number of samples with time `< t` (binary search; the ring is sorted).
    pub fn lower_bound(&self, t: f64) -> usize {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.time(mid) < t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Number of samples with time `<= t`.
    pub fn upper_bound(&self, t: f64) -> usize {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.time(mid) <= t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Linear interpolation of column `g` (W) at `t` between samples `i` and `i + 1`.
    fn interpolate_w(&self, i: usize, g: usize, t: f64) -> f64 {
        let (t0, t1) = (self.time(i), self.time(i + 1));
        let (p0, p1) = (self.power_mw(i, g) as f64, self.power_mw(i + 1, g) as f64);
        let f = if t1 > t0 { (t - t0) / (t1 - t0) } else { 0.0 };
        (p0 + (p1 - p0) * f) / 1000.0
    }

    /// Energy (J) per GPU column over `[start, end]` by the trapezoidal rule.
    ///
    /// The points are the samples inside the interval plus, at each end that falls strictly
    /// between two samples, the value interpolated there, so a window is integrated over its
    /// whole length even when no sample lands exactly on its edges. `None` with fewer than two
    /// points (as the reference returns `None` when `auc` has too few).
    pub fn energy(&self, start: f64, end: f64) -> Option<Vec<f64>> {
        if self.len == 0 || start.is_nan() || end.is_nan() || end < start {
            return None;
        }
        let lo = self.lower_bound(start); // first sample >= start
        let hi = self.upper_bound(end); // one past the last sample <= end
        let left = lo > 0 && lo < self.len && self.time(lo) > start;
        let right = hi > 0 && hi < self.len && self.time(hi - 1) < end;
        let inner = hi.saturating_sub(lo);
        if inner + usize::from(left) + usize::from(right) < 2 {
            return None;
        }
        let mut out = Vec::with_capacity(self.n_gpus);
        for g in 0..self.n_gpus {
            let mut acc = 0.0;
            let mut prev: Option<(f64, f64)> =
                left.then(|| (start, self.interpolate_w(lo - 1, g, start)));
            for i in lo..hi {
                let (t, p) = (self.time(i), self.power_mw(i, g) as f64 / 1000.0);
                if let Some((pt, pp)) = prev {
                    acc += (t - pt) * (p + pp) / 2.0;
                }
                prev = Some((t, p));
            }
            if right {
                let p = self.interpolate_w(hi - 1, g, end);
                if let Some((pt, pp)) = prev {
                    acc += (end - pt) * (p + pp) / 2.0;
                }
            }
            out.push(acc);
        }
        Some(out)
    }

    /// The ~95% bound (J) per GPU column of [`Timeline::energy`] over `[start, end]`.
    ///
    /// Between two samples the power may have moved anywhere between their values, at any
    /// moment: the trapezoid is then off by up to half the change times the gap. A gap longer
    /// than `2 * period` (samples missing: a driver fault) may have held anything up to
    /// `max_w[g]`. Readings describe the driver's last update, up to `lag` s before their
    /// timestamps: the window's edges may be shifted by that, at the power there. And 1% of the
    /// energy for the readings' own noise and offset.
    pub fn energy_bound(
        &self,
        start: f64,
        end: f64,
        period: f64,
        lag: f64,
        max_w: &[f64],
    ) -> Option<Vec<f64>> {
        let energy = self.energy(start, end)?;
        let lo = self.lower_bound(start).saturating_sub(1);
        let hi = self.upper_bound(end).min(self.len);
        let mut out = Vec::with_capacity(self.n_gpus);
        for (g, &e) in energy.iter().enumerate() {
            let mut b = 0.01 * e;
            for i in lo..hi.saturating_sub(1) {
                let (t0, t1) = (self.time(i).max(start), self.time(i + 1).min(end));
                if t1 <= t0 {
                    continue;
                }
                let (p0, p1) = (
                    self.power_mw(i, g) as f64 / 1000.0,
                    self.power_mw(i + 1, g) as f64 / 1000.0,
                );
                b += if self.time(i + 1) - self.time(i) > 2.0 * period {
                    max_w.get(g).copied().unwrap_or(0.0).max(p0.max(p1)) * (t1 - t0)
                } else {
                    (p1 - p0).abs() * (t1 - t0) / 2.0
                };
            }
            let edge = |t: f64| self.interpolate_at(t, g).unwrap_or(0.0);
            b += (edge(end) - edge(start)).abs() * lag;
            out.push(b);
        }
        Some(out)
    }

    /// Column `g` (W) at `t`, interpolated, clamped to the first and last samples.
    fn interpolate_at(&self, t: f64, g: usize) -> Option<f64> {
        if self.len == 0 {
            return None;
        }
        let i = self.lower_bound(t);
        if i == 0 {
            return Some(self.power_mw(0, g) as f64 / 1000.0);
        }
        if i >= self.len {
            return Some(self.power_mw(self.len - 1, g) as f64 / 1000.0);
        }
        Some(self.interpolate_w(i - 1, g, t))
    }

    /// Power (W) per GPU column: the latest sample if `t` is `None`, else the first sample at or
    /// after `t`, or the latest if none is (the reference's `searchsorted`, clamped).
    pub fn power(&self, t: Option<f64>) -> Option<Vec<f64>> {
        if self.len == 0 {
            return None;
        }
        let i = match t {
            None => self.len - 1,
            Some(t) => self.lower_bound(t).min(self.len - 1),
        };
        Some(
            (0..self.n_gpus)
                .map(|g| self.power_mw(i, g) as f64 / 1000.0)
                .collect(),
        )
    }

    /// All samples, oldest first: timestamps and, per GPU column, power in W.
    pub fn to_columns(&self) -> (Vec<f64>, Vec<Vec<f64>>) {
        let times = (0..self.len).map(|i| self.time(i)).collect();
        let powers = (0..self.n_gpus)
            .map(|g| {
                (0..self.len)
                    .map(|i| self.power_mw(i, g) as f64 / 1000.0)
                    .collect()
            })
            .collect();
        (times, powers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ring_overwrites_oldest_and_stays_sorted() {
        let mut tl = Timeline::new(2, 3);
        for k in 0..5 {
            assert!(tl.push(k as f64, &[k * 1000, k * 2000]));
        }
        assert_eq!(tl.len(), 3);
        assert_eq!((tl.time(0), tl.time(2)), (2.0, 4.0));
        assert_eq!(tl.power_mw(0, 1), 4000);
        assert!(!tl.push(4.0, &[0, 0]), "equal timestamps are dropped");
        assert!(!tl.push(3.5, &[0, 0]), "older timestamps are dropped");
        assert_eq!(tl.allocated_bytes(), 3 * 8 + 6 * 4);
        assert_eq!(tl.bytes_per_sample_per_gpu(), 8.0);
    }

    #[test]
    fn energy_of_constant_power_and_edges() {
        let mut tl = Timeline::new(1, 100);
        for k in 0..=10 {
            tl.push(k as f64, &[100_000]);
        }
        let e = tl.energy(0.0, 10.0).unwrap()[0];
        assert!((e - 1000.0).abs() < 1e-9);
        // Window edges between samples are interpolated, not dropped.
        let e = tl.energy(0.5, 2.25).unwrap()[0];
        assert!((e - 175.0).abs() < 1e-9, "{e}");
        // Inside one sample interval: two interpolated points.
        let e = tl.energy(3.2, 3.7).unwrap()[0];
        assert!((e - 50.0).abs() < 1e-9, "{e}");
        // Outside the timeline, or a single point: too few points.
        assert!(tl.energy(11.0, 12.0).is_none());
        assert!(tl.energy(10.0, 12.0).is_none());
        assert!(tl.energy(5.0, 4.0).is_none());
    }

    #[test]
    fn power_lookup_is_searchsorted_clamped() {
        let mut tl = Timeline::new(1, 10);
        assert!(tl.power(None).is_none());
        tl.push(1.0, &[1000]);
        tl.push(2.0, &[2000]);
        tl.push(3.0, &[3000]);
        assert_eq!(tl.power(None).unwrap(), vec![3.0]);
        assert_eq!(tl.power(Some(1.5)).unwrap(), vec![2.0]);
        assert_eq!(tl.power(Some(2.0)).unwrap(), vec![2.0]);
        assert_eq!(tl.power(Some(0.0)).unwrap(), vec![1.0]);
        assert_eq!(tl.power(Some(9.0)).unwrap(), vec![3.0]);
    }

    proptest! {
        /// Integrating a linear power ramp is exact with trapezoids, for any window and any
        /// sample placement, and splitting a window in two adds up.
        #[test]
        fn trapezoid_exact_for_ramps_and_additive(
            gaps in proptest::collection::vec(0.01f64..1.0, 2..60),
            a in 0.0f64..1.0, b in 0.0f64..1.0, c in 0.0f64..1.0,
            slope in 0.0f64..500.0,
        ) {
            let mut tl = Timeline::new(1, 1000);
            let mut t = 0.0;
            let mut ts = Vec::new();
            for g in &gaps {
                // Power (mW) proportional to time, rounded to whole mW at integral times only
                // when exact; use slope * t with t on a 1/1000 grid to keep readings exact.
                let tq = (t * 1000.0f64).round() / 1000.0;
                tl.push(tq, &[(slope * tq * 1000.0).round() as u32]);
                ts.push(tq);
                t += g;
            }
            let (t0, t1) = (ts[0], *ts.last().unwrap());
            let mut w = [t0 + a * (t1 - t0), t0 + b * (t1 - t0), t0 + c * (t1 - t0)];
            w.sort_by(f64::total_cmp);
            if let Some(e) = tl.energy(w[0], w[2]) {
                let want = slope / 2.0 * (w[2] * w[2] - w[0] * w[0]);
                prop_assert!((e[0] - want).abs() <= 1e-3 * (1.0 + want.abs()) + 1e-3 * (w[2] - w[0]), "{} vs {}", e[0], want);
                if let (Some(l), Some(r)) = (tl.energy(w[0], w[1]), tl.energy(w[1], w[2])) {
                    prop_assert!((l[0] + r[0] - e[0]).abs() <= 1e-6 * (1.0 + e[0].abs()));
                }
            }
        }
    }
}
