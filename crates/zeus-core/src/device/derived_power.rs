//! Power from the energy counter, for boards that report no power at all (an MI300X whose
//! `current_socket_power` is unfilled, and which has no average either).
//!
//! Power derived from counter deltas matches off-chip meters and responds faster than AMD's
//! reported power (arXiv 2604.06056, on MI250X and MI300A), so where the board gives no power
//! reading zeus makes one (`adjusted.rs` applies it): the counter's energy over the stretch since the previous
//! derivation, at least [`MIN_SPAN_S`] long, as the "average power" reading. Everything that
//! needs power (the sampler's model, `PowerMonitor`, the optimizers) then works unchanged.

use std::sync::{Arc, Mutex};

use super::{Clock, Gpu, GpuError, GpuResult};

/// The shortest stretch a derived reading covers, s: long enough that the counter's 1 ms
/// updates and its mJ steps are a small part of it, short enough to follow a training step.
pub const MIN_SPAN_S: f64 = 0.005;

/// Whether `gpu` has no power reading of either kind but a counter.
pub fn is_powerless(gpu: &dyn Gpu) -> bool {
    matches!(gpu.instant_power_usage(), Err(GpuError::NotSupported(_)))
        && matches!(gpu.average_power_usage(), Err(GpuError::NotSupported(_)))
        && matches!(gpu.supports_total_energy_consumption(), Ok(true))
}

/// The derivation's state: where the last stretch ended, and what it gave.
pub struct DerivedPower {
    clock: Arc<dyn Clock>,
    last: Mutex<Option<Derivation>>,
}

/// Where the last derivation ended, and what it gave.
#[derive(Clone, Copy)]
struct Derivation {
    t: f64,
    mj: u64,
    /// Its result, mW (`None` until a stretch long enough has passed).
    mw: Option<u32>,
}

impl DerivedPower {
    pub fn new(clock: Arc<dyn Clock>) -> DerivedPower {
        DerivedPower {
            clock,
            last: Mutex::new(None),
        }
    }

    /// `gpu`'s power now (mW): its counter's energy over the stretch since the last
    /// derivation, once that is at least [`MIN_SPAN_S`] long (the first call waits it out).
    pub fn milliwatts(&self, gpu: &dyn Gpu) -> GpuResult<u32> {
        // At most: a first read, a wait for the stretch, the reading.
        for _ in 0..3 {
            let wait = {
                let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
                let e = gpu.total_energy_consumption()?;
                let t = self.clock.now();
                match *last {
                    None => {
                        *last = Some(Derivation { t, mj: e, mw: None });
                        MIN_SPAN_S
                    }
                    Some(Derivation {
                        t: t0,
                        mj: e0,
                        mw: value,
                    }) => {
                        let span = t - t0;
                        if span >= MIN_SPAN_S || (self.clock.is_virtual() && span > 0.0) {
                            // A counter that went backwards (a reset) gives no reading for
                            // this stretch: the previous one stands.
                            let mw = if e >= e0 {
                                ((e - e0) as f64 / span).round().min(f64::from(u32::MAX)) as u32
                            } else {
                                value.unwrap_or(0)
                            };
                            *last = Some(Derivation {
                                t,
                                mj: e,
                                mw: Some(mw),
                            });
                            return Ok(mw);
                        }
                        if let Some(mw) = value {
                            return Ok(mw);
                        }
                        MIN_SPAN_S - span
                    }
                }
            };
            if self.clock.is_virtual() {
                return Err(GpuError::NotSupported(
                    "derived power: no stretch yet (the virtual clock has not moved)".into(),
                ));
            }
            std::thread::sleep(std::time::Duration::from_secs_f64(wait));
        }
        Err(GpuError::Unknown(
            "derived power: the clock did not move past the first counter read".into(),
        ))
    }
}
