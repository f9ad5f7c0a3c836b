//! [`TemperatureMonitor`]: GPU temperature over time, sampled by the process's shared sampler
//! thread (no thread of its own), kept per GPU in a bounded history.

use std::sync::{Arc, Mutex};

use super::error::{MonitorError, MonitorResult};
use super::sampler::{Interest, Lease, Sampler, Watched};
use crate::device::Gpus;

/// `(timestamp, °C)` samples of one GPU, oldest first.
pub type TemperatureSamples = Vec<(f64, f64)>;

/// GPU temperature over time: a lease on the shared sampler for some GPUs' temperatures.
pub struct TemperatureMonitor {
    indices: Vec<usize>,
    period: f64,
    watched: Vec<Arc<Watched>>,
    /// `None` once stopped; the samples taken stay readable through `watched`.
    lease: Mutex<Option<Lease>>,
}

impl TemperatureMonitor {
    /// Watch `gpu_indices` (all visible GPUs if `None`) every `update_period` seconds, keeping
    /// `max_samples_per_gpu` samples per GPU (an hour's worth if `None`).
    ///
    /// # Errors
    /// [`MonitorError::InvalidArg`] on the virtual clock (the sampler runs in real time), for a
    /// period below [`super::power::MIN_PERIOD`], no room for a sample, or a bad index; the
    /// GPU's own error for one without a temperature sensor; [`MonitorError::Io`] if the
    /// sampler thread cannot start.
    pub fn new(
        gpus: &Gpus,
        gpu_indices: Option<Vec<usize>>,
        update_period: f64,
        max_samples_per_gpu: Option<usize>,
    ) -> MonitorResult<Self> {
        if gpus.clock().is_virtual() {
            return Err(MonitorError::InvalidArg(
                "TemperatureMonitor needs the real clock: the sampler runs in real time".into(),
            ));
        }
        if !(update_period.is_finite() && update_period >= super::power::MIN_PERIOD) {
            return Err(MonitorError::InvalidArg(format!(
                "update_period must be at least {} s, got {update_period}",
                super::power::MIN_PERIOD
            )));
        }
        let capacity = match max_samples_per_gpu {
            Some(0) => {
                return Err(MonitorError::InvalidArg(
                    "max_samples_per_gpu must be at least 1, got 0".into(),
                ))
            }
            Some(n) => n,
            None => ((3600.0 / update_period).ceil() as usize).clamp(2, 1 << 20),
        };
        let indices = gpu_indices.unwrap_or_else(|| (0..gpus.len()).collect());
        super::power::check_indices(gpus, &indices)?;
        let devices = indices
            .iter()
            .map(|&i| gpus.device(i).cloned())
            .collect::<crate::device::GpuResult<Vec<_>>>()?;
        // A GPU without a temperature sensor fails here, with its own error.
        for d in &devices {
            d.temperature_c()?;
        }
        let interest = Interest::Temperature {
            period: update_period,
            capacity,
        };
        let lease = Sampler::lease_for(&devices, interest)?;
        let watched = (0..lease.len()).map(|k| lease.watched(k).clone()).collect();
        Ok(TemperatureMonitor {
            indices,
            period: update_period,
            watched,
            lease: Mutex::new(Some(lease)),
        })
    }

    /// The watched GPUs (framework indices).
    pub fn gpu_indices(&self) -> &[usize] {
        &self.indices
    }

    /// Seconds between samples.
    pub fn update_period(&self) -> f64 {
        self.period
    }

    /// `(gpu_index, [(timestamp, °C), ...])` of each watched GPU (or of `gpu_index` alone),
    /// oldest first, within `[start, end]`.
    ///
    /// # Errors
    /// [`MonitorError::InvalidArg`] for a GPU not watched; [`MonitorError::Stopped`] when
    /// sampling a GPU's temperature failed.
    pub fn timeline(
        &self,
        gpu_index: Option<usize>,
        start: f64,
        end: f64,
    ) -> MonitorResult<Vec<(usize, TemperatureSamples)>> {
        self.check()?;
        let columns = match gpu_index {
            None => (0..self.indices.len()).collect(),
            Some(i) => vec![self.column(i)?],
        };
        Ok(columns
            .into_iter()
            .map(|k| (self.indices[k], self.watched[k].temperatures(start, end)))
            .collect())
    }

    /// `(gpu_index, °C)` of each watched GPU: the latest sample, or the latest at or before
    /// `time`; `None` if a GPU has no such sample yet.
    ///
    /// # Errors
    /// [`MonitorError::Stopped`] when sampling a GPU's temperature failed.
    pub fn latest(&self, time: Option<f64>) -> MonitorResult<Option<Vec<(usize, f64)>>> {
        self.check()?;
        let mut out = Vec::with_capacity(self.indices.len());
        for (&i, w) in self.indices.iter().zip(&self.watched) {
            let Some((_, c)) = w.temperature_at(time) else {
                return Ok(None);
            };
            out.push((i, c));
        }
        Ok(Some(out))
    }

    /// Stop sampling (idempotent); samples taken stay readable.
    pub fn stop(&self) {
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(lease);
    }

    fn column(&self, gpu_index: usize) -> MonitorResult<usize> {
        self.indices
            .iter()
            .position(|&i| i == gpu_index)
            .ok_or_else(|| {
                MonitorError::InvalidArg(format!(
                    "GPU {gpu_index} is not monitored (gpu_indices: {:?})",
                    self.indices
                ))
            })
    }

    fn check(&self) -> MonitorResult<()> {
        for (i, w) in self.indices.iter().zip(&self.watched) {
            if let Some(e) = w.temperature_error() {
                return Err(MonitorError::Stopped(format!(
                    "temperature sampling of GPU {i} stopped: {e}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::power::tests::sim;

    fn refused(
        gpus: &Gpus,
        indices: Option<Vec<usize>>,
        period: f64,
        cap: Option<usize>,
    ) -> String {
        match TemperatureMonitor::new(gpus, indices, period, cap) {
            Err(MonitorError::InvalidArg(m)) => m,
            Err(e) => panic!("another error: {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn bad_settings_are_refused_naming_the_value() {
        let (_c, virtual_gpus) = sim(&["A40"], true);
        assert!(refused(&virtual_gpus, None, 1.0, None).contains("real clock"));
        let (_c, gpus) = sim(&["A40", "H100"], false);
        assert!(refused(&gpus, None, 0.0, None).contains("got 0"));
        assert!(refused(&gpus, None, f64::NAN, None).contains("got NaN"));
        assert!(refused(&gpus, None, 1.0, Some(0)).contains("max_samples_per_gpu"));
        assert!(refused(&gpus, Some(vec![0, 5]), 1.0, None).contains('5'));
    }

    #[test]
    fn samples_arrive_per_gpu_and_stay_readable_after_stop() {
        let (_c, gpus) = sim(&["A40", "H100"], false);
        let tm = TemperatureMonitor::new(&gpus, Some(vec![1]), 0.01, Some(3)).unwrap();
        assert_eq!(tm.gpu_indices(), &[1]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while tm.timeline(None, f64::NEG_INFINITY, f64::INFINITY).unwrap()[0]
            .1
            .len()
            < 3
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no samples within 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        tm.stop();
        let timeline = tm
            .timeline(Some(1), f64::NEG_INFINITY, f64::INFINITY)
            .unwrap();
        assert_eq!(timeline.len(), 1);
        assert_eq!(
            timeline[0].1.len(),
            3,
            "the history keeps max_samples_per_gpu"
        );
        let latest = tm.latest(None).unwrap().expect("a sample");
        assert_eq!(latest, vec![(1, timeline[0].1[2].1)]);
        assert!(matches!(
            tm.timeline(Some(0), 0.0, 1.0),
            Err(MonitorError::InvalidArg(m)) if m.contains("GPU 0 is not monitored")
        ));
    }
}
