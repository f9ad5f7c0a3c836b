//! Power from the energy counter, for boards that report no power at all (an MI300X whose
//! `current_socket_power` is unfilled, and which has no average either).
//!
//! Power derived from counter deltas matches off-chip meters and responds faster than AMD's
//! reported power (arXiv 2604.06056, on MI250X and MI300A), so where the board gives no power
//! reading the wrapper makes one: the counter's energy over the stretch since the previous
//! derivation, at least [`MIN_SPAN_S`] long, as the "average power" reading. Everything that
//! needs power (the sampler's model, `PowerMonitor`, the optimizers) then works unchanged.

use std::sync::{Arc, Mutex};

use super::adjusted::{Adjusted, Change};
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

/// Give every device that [`is_powerless`] a derived power ([`Change::PowerFromCounter`]);
/// `notes` gets a line for each.
pub fn wrap_powerless(
    devices: Vec<Arc<dyn Gpu>>,
    clock: Arc<dyn Clock>,
    notes: &mut Vec<String>,
) -> Vec<Arc<dyn Gpu>> {
    devices
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            if !is_powerless(d.as_ref()) {
                return d;
            }
            let name = d.name().unwrap_or_else(|_| "?".into());
            notes.push(format!(
                "GPU {i} ({name}) reports no power: its power is derived from its energy counter \
                 (over {:.0} ms stretches), and the counter cannot be checked against power",
                MIN_SPAN_S * 1000.0
            ));
            let change = Change::PowerFromCounter(DerivedPower::new(clock.clone()));
            Arc::new(Adjusted::new(d, change)) as Arc<dyn Gpu>
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{preset, BoardKnobs, Fidelity, Load, SimCluster, SimConfig};

    #[test]
    fn a_board_without_power_gets_it_from_its_counter() {
        let c = SimCluster::new(SimConfig {
            presets: vec![preset::find("MI300X").unwrap()],
            load: Load::Busy,
            fidelity: Fidelity::Real,
            board: BoardKnobs {
                instant_power: Some(false),
                ..BoardKnobs::default()
            },
            ..SimConfig::default()
        });
        let mut notes = Vec::new();
        let devs = wrap_powerless(c.gpu_devices(), c.clock(), &mut notes);
        assert!(notes[0].contains("reports no power"), "{notes:?}");
        let truth = c.devices()[0].true_power_w();
        let mw = devs[0].average_power_usage().unwrap();
        // The counter's 1 ms updates over a >= 5 ms stretch: within a fifth.
        let w = f64::from(mw) / 1000.0;
        assert!((w - truth).abs() < 0.2 * truth, "{w} W vs {truth} W");
        assert!(devs[0].instant_power_usage().is_err());
        assert_eq!(devs[0].power_update_period(), Some(MIN_SPAN_S));
    }

    #[test]
    fn boards_with_power_are_left_alone() {
        let c = SimCluster::new(SimConfig {
            presets: vec![
                preset::find("MI300X").unwrap(),
                preset::find("A40").unwrap(),
            ],
            ..SimConfig::default()
        });
        let mut notes = Vec::new();
        let devs = wrap_powerless(c.gpu_devices(), c.clock(), &mut notes);
        assert!(notes.is_empty());
        assert!(devs[0].instant_power_usage().is_ok());
    }
}
