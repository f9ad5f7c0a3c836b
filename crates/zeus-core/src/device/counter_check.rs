//! The energy counter's check when the GPUs are opened, for boards whose counter is known to
//! lie: AMD's. The counter froze until reboot on MI100 and read 15× low on MI210 (amdsmi#38),
//! and is unavailable in VM guests, so, as Zeus does, it is compared with the board's power
//! over half a second before anyone relies on it. A counter that moved by less than a tenth or
//! more than ten times what the power says, or backwards, is disabled: the device then reports
//! no counter and the monitors integrate power instead, with a warning saying why.
//!
//! The sampler's self-check (`monitor/sampler/track/check.rs`) keeps watching the counters
//! that pass, for faults that start later.

use std::sync::Arc;

use super::adjusted::{Adjusted, Change};
use super::{Clock, Gpu, Vendor};

/// How long the check watches the counter, s.
pub const CHECK_S: f64 = 0.5;
/// The counter's energy over the check must be within these multiples of the power's.
pub const RATIO_RANGE: (f64, f64) = (0.1, 10.0);

/// Whether a counter is to be trusted, from what it and the power said over the check.
///
/// `power_mw`: the mean power reading; `seconds`: how long the check took; `start_mj` and
/// `end_mj`: the counter's readings. `Err` says why not.
pub fn verdict(power_mw: f64, seconds: f64, start_mj: u64, end_mj: u64) -> Result<(), String> {
    if power_mw < 1.0 {
        return Err(
            "it reports no power, so its counter cannot be checked (the odd die of an MI250X \
             reports 0 W: its power and energy are counted on the even die)"
                .into(),
        );
    }
    if end_mj < start_mj {
        return Err(format!(
            "its counter went backwards ({start_mj} mJ, then {end_mj} mJ {seconds:.2} s later)"
        ));
    }
    let expected_j = power_mw / 1000.0 * seconds;
    let counted_j = (end_mj - start_mj) as f64 / 1000.0;
    let ratio = counted_j / expected_j;
    if ratio <= RATIO_RANGE.0 || ratio >= RATIO_RANGE.1 {
        return Err(format!(
            "its counter counted {counted_j:.3} J in {seconds:.2} s while its power said \
             {expected_j:.3} J ({ratio:.3}×, outside {}-{}×)",
            RATIO_RANGE.0, RATIO_RANGE.1
        ));
    }
    Ok(())
}

/// Whether `gpu`'s counter gets the check: AMD boards that have one, and a power reading to
/// check it with (a board without one gets its power from the counter instead:
/// `device/derived_power.rs`).
fn wants_check(gpu: &dyn Gpu) -> bool {
    gpu.vendor() == Vendor::Amd
        && matches!(gpu.supports_total_energy_consumption(), Ok(true))
        && !super::derived_power::is_powerless(gpu)
}

fn power_mw(gpu: &dyn Gpu) -> Option<f64> {
    gpu.instant_power_usage()
        .or_else(|_| gpu.average_power_usage())
        .ok()
        .map(f64::from)
}

/// Check the counters of the devices that need it, all at once (one wait for all), and
/// return the devices with failing counters disabled, plus a warning for each.
///
/// On a virtual clock nothing can be waited for, so nothing is checked.
pub fn check_counters(
    devices: Vec<Arc<dyn Gpu>>,
    clock: &dyn Clock,
) -> (Vec<Arc<dyn Gpu>>, Vec<String>) {
    let todo: Vec<usize> = (0..devices.len())
        .filter(|&i| wants_check(devices[i].as_ref()))
        .collect();
    if todo.is_empty() || clock.is_virtual() {
        return (devices, Vec::new());
    }
    let start = |i: usize| {
        let g = devices[i].as_ref();
        (power_mw(g), g.total_energy_consumption().ok())
    };
    let t0 = clock.now();
    let first: Vec<_> = todo.iter().map(|&i| start(i)).collect();
    std::thread::sleep(std::time::Duration::from_secs_f64(CHECK_S));
    let t1 = clock.now();
    let second: Vec<_> = todo.iter().map(|&i| start(i)).collect();
    let mut out = devices;
    let mut notes = Vec::new();
    for (k, &i) in todo.iter().enumerate() {
        let why = match (first[k], second[k]) {
            ((p0, Some(e0)), (p1, Some(e1))) => {
                let p = match (p0, p1) {
                    (Some(a), Some(b)) => (a + b) / 2.0,
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => 0.0,
                };
                verdict(p, t1 - t0, e0, e1).err()
            }
            _ => Some("its counter could not be read".to_string()),
        };
        if let Some(why) = why {
            let name = out[i].name().unwrap_or_else(|_| "?".into());
            notes.push(format!(
                "GPU {i} ({name}): energy counter disabled, energy comes from integrating power \
                 instead: {why}"
            ));
            out[i] = Arc::new(Adjusted::new(out[i].clone(), Change::CounterOff(why)));
        }
    }
    (out, notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{preset, BoardKnobs, Fidelity, Load, SimCluster, SimConfig};
    use proptest::prelude::*;

    #[test]
    fn verdicts_follow_zeus_rule() {
        // 300 W for 0.5 s is 150 J.
        assert!(verdict(300_000.0, 0.5, 1_000, 151_000).is_ok());
        let low = verdict(300_000.0, 0.5, 0, 10_000).unwrap_err();
        assert!(low.contains("0.067×"), "{low}");
        assert!(verdict(300_000.0, 0.5, 0, 2_000_000).is_err());
        assert!(verdict(300_000.0, 0.5, 0, 0).is_err(), "frozen");
        assert!(verdict(300_000.0, 0.5, 5_000, 4_000)
            .unwrap_err()
            .contains("backwards"));
        assert!(verdict(0.0, 0.5, 0, 0).unwrap_err().contains("no power"));
    }

    proptest! {
        #[test]
        fn a_counter_within_the_range_passes_and_outside_fails(
            watts in 10.0f64..1000.0, ratio in 0.01f64..100.0,
        ) {
            let e = (watts * 0.5 * ratio * 1000.0) as u64;
            let ok = verdict(watts * 1000.0, 0.5, 0, e).is_ok();
            // Away from the edges (the counter's mJ truncation decides at them).
            if ratio > 0.101 && ratio < 9.99 {
                prop_assert!(ok);
            }
            if !(0.099..=10.01).contains(&ratio) {
                prop_assert!(!ok);
            }
        }
    }

    fn amd_cluster(keys: &[&str], board: BoardKnobs) -> SimCluster {
        SimCluster::new(SimConfig {
            presets: keys
                .iter()
                .flat_map(|k| {
                    let p = preset::find(k).unwrap();
                    std::iter::repeat_n(p, p.dies)
                })
                .collect(),
            load: Load::Busy,
            fidelity: Fidelity::Real,
            board,
            ..SimConfig::default()
        })
    }

    #[test]
    fn healthy_counters_pass_and_wrong_ones_are_disabled_with_a_reason() {
        let c = amd_cluster(&["MI300X", "MI250X"], BoardKnobs::default());
        let (devs, notes) = check_counters(c.gpu_devices(), c.clock().as_ref());
        // The MI300X and the MI250X's even die pass; the odd die reports no power.
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("GPU 2 ") && notes[0].contains("no power"));
        assert!(devs[0].supports_total_energy_consumption().unwrap());
        assert!(devs[1].supports_total_energy_consumption().unwrap());
        assert!(!devs[2].supports_total_energy_consumption().unwrap());
        assert!(devs[2].total_energy_consumption().is_err());

        let wrong = amd_cluster(
            &["MI210"],
            BoardKnobs {
                counter_scale: Some(1.0 / 15.0),
                ..BoardKnobs::default()
            },
        );
        let (devs, notes) = check_counters(wrong.gpu_devices(), wrong.clock().as_ref());
        assert!(notes[0].contains("outside 0.1-10×"), "{notes:?}");
        assert!(!devs[0].supports_total_energy_consumption().unwrap());
        // Everything else passes through.
        assert!(devs[0].average_power_usage().unwrap() > 0);
        assert!(devs[0].name().unwrap().contains("MI210"));

        let frozen = amd_cluster(
            &["MI300X"],
            BoardKnobs {
                counter_frozen: true,
                ..BoardKnobs::default()
            },
        );
        let (_, notes) = check_counters(frozen.gpu_devices(), frozen.clock().as_ref());
        assert!(notes[0].contains("counted 0.000 J"), "{notes:?}");
    }

    #[test]
    fn nvidia_boards_are_not_held_up() {
        let c = SimCluster::new(SimConfig {
            presets: vec![preset::find("H100").unwrap()],
            ..SimConfig::default()
        });
        let (devs, notes) = check_counters(c.gpu_devices(), c.clock().as_ref());
        assert!(notes.is_empty());
        assert!(devs[0].supports_total_energy_consumption().unwrap());
    }
}
