//! Optimum selectors: given one measurement per profiled power limit, in profiling order
//! (highest limit first), pick the power limit to train with.
//!
//! Tie rule, for every selector: the earliest measurement in profiling order wins, which is the
//! highest power limit among equals (the reference's `min(...)` over a list does the same).

use std::collections::HashMap;

use thiserror::Error;

use crate::util::metric::zeus_cost;

/// What was measured while training at one power limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    /// Watts.
    pub power_limit: u32,
    /// Joules, summed over every GPU that ran at this limit.
    pub energy: f64,
    /// Seconds.
    pub time: f64,
}

impl Measurement {
    pub fn new(power_limit: u32, energy: f64, time: f64) -> Measurement {
        Measurement {
            power_limit,
            energy,
            time,
        }
    }
}

/// Bad selector parameters or measurements. Every message names the offending value.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SelectorError {
    #[error("eta_knob must be between 0 and 1, got {0}")]
    InvalidEta(f64),
    #[error("world_size must be at least 1, got {0}")]
    InvalidWorldSize(i64),
    #[error("factor must be at least 1, got {0}")]
    InvalidFactor(f64),
    #[error("no measurements to select a power limit from")]
    Empty,
    #[error(
        "measurement {index} is invalid (power_limit={power_limit} W, energy={energy} J, \
         time={time} s): the power limit must be positive and energy and time positive and finite"
    )]
    InvalidMeasurement {
        index: usize,
        power_limit: u32,
        energy: f64,
        time: f64,
    },
}

/// A rule that picks the optimal power limit from the profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Selector {
    /// Least energy.
    Energy,
    /// Least time.
    Time,
    /// Least Zeus cost `η·E + (1−η)·P_max·T`, where `P_max` is the highest profiled power limit
    /// times `world_size` (the number of GPUs whose energy is summed in each measurement).
    ZeusCost { eta_knob: f64, world_size: u32 },
    /// The lowest power limit whose time is at most `factor` times the time measured at the
    /// highest power limit.
    MaxSlowdownConstraint { factor: f64 },
}

impl Selector {
    /// `ZeusCost`, checking `0 ≤ eta_knob ≤ 1` and `world_size ≥ 1`.
    pub fn zeus_cost(eta_knob: f64, world_size: i64) -> Result<Selector, SelectorError> {
        // Written so that NaN fails too.
        if !(0.0..=1.0).contains(&eta_knob) {
            return Err(SelectorError::InvalidEta(eta_knob));
        }
        if world_size < 1 || world_size > i64::from(u32::MAX) {
            return Err(SelectorError::InvalidWorldSize(world_size));
        }
        Ok(Selector::ZeusCost {
            eta_knob,
            world_size: world_size as u32,
        })
    }

    /// `MaxSlowdownConstraint`, checking `factor ≥ 1` (and finite).
    pub fn max_slowdown(factor: f64) -> Result<Selector, SelectorError> {
        if factor.is_nan() || factor < 1.0 || factor.is_infinite() {
            return Err(SelectorError::InvalidFactor(factor));
        }
        Ok(Selector::MaxSlowdownConstraint { factor })
    }

    /// The chosen power limit in watts.
    pub fn select(&self, measurements: &[Measurement]) -> Result<u32, SelectorError> {
        validate(measurements)?;
        let chosen = match *self {
            Selector::Energy => argmin_first(measurements, |m| m.energy),
            Selector::Time => argmin_first(measurements, |m| m.time),
            Selector::ZeusCost {
                eta_knob,
                world_size,
            } => zeus_cost_choice(measurements, eta_knob, world_size),
            Selector::MaxSlowdownConstraint { factor } => slowdown_choice(measurements, factor),
        };
        Ok(chosen)
    }
}

fn validate(measurements: &[Measurement]) -> Result<(), SelectorError> {
    if measurements.is_empty() {
        return Err(SelectorError::Empty);
    }
    for (index, m) in measurements.iter().enumerate() {
        let good = |x: f64| x.is_finite() && x > 0.0;
        if m.power_limit == 0 || !good(m.energy) || !good(m.time) {
            return Err(SelectorError::InvalidMeasurement {
                index,
                power_limit: m.power_limit,
                energy: m.energy,
                time: m.time,
            });
        }
    }
    Ok(())
}

/// Power limit of the first measurement with the least `key`. Non-empty input.
fn argmin_first(measurements: &[Measurement], key: impl Fn(&Measurement) -> f64) -> u32 {
    let mut best = &measurements[0];
    let mut best_key = key(best);
    for m in &measurements[1..] {
        let k = key(m);
        // Strictly less: an equal value later in profiling order does not replace the earlier.
        if k < best_key {
            best = m;
            best_key = k;
        }
    }
    best.power_limit
}

fn zeus_cost_choice(measurements: &[Measurement], eta_knob: f64, world_size: u32) -> u32 {
    let max_pl = measurements
        .iter()
        .map(|m| m.power_limit)
        .max()
        .unwrap_or(0);
    let max_power = f64::from(max_pl) * f64::from(world_size);
    // The reference builds `{power_limit: cost}` in measurement order: a limit measured twice
    // keeps its first position and its last cost. Keep that behaviour.
    let mut costs: Vec<(u32, f64)> = Vec::with_capacity(measurements.len());
    // Real profiles have about ten limits: a linear scan beats hashing there; long synthetic
    // profiles (every watt) get an index so the cost stays linear.
    let mut slot_of: Option<HashMap<u32, usize>> =
        (measurements.len() > 32).then(|| HashMap::with_capacity(measurements.len()));
    for m in measurements {
        let c = zeus_cost(m.energy, m.time, eta_knob, max_power);
        let slot = match &slot_of {
            Some(index) => index.get(&m.power_limit).copied(),
            None => costs.iter().position(|(pl, _)| *pl == m.power_limit),
        };
        match slot {
            Some(slot) => costs[slot].1 = c,
            None => {
                if let Some(index) = slot_of.as_mut() {
                    index.insert(m.power_limit, costs.len());
                }
                costs.push((m.power_limit, c));
            }
        }
    }
    let mut best = costs[0];
    for &(pl, c) in &costs[1..] {
        if c < best.1 {
            best = (pl, c);
        }
    }
    best.0
}

fn slowdown_choice(measurements: &[Measurement], factor: f64) -> u32 {
    // The baseline is the time at the highest power limit (its first measurement), not the
    // shortest time: the constraint is about slowing down relative to running unconstrained.
    let mut base = &measurements[0];
    for m in &measurements[1..] {
        if m.power_limit > base.power_limit {
            base = m;
        }
    }
    let bound = factor * base.time;
    measurements
        .iter()
        .filter(|m| m.time <= bound)
        .map(|m| m.power_limit)
        .min()
        // The baseline itself always satisfies `time <= factor * time` for factor >= 1.
        .unwrap_or(base.power_limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(pl: u32, e: f64, t: f64) -> Measurement {
        Measurement::new(pl, e, t)
    }

    fn profile() -> Vec<Measurement> {
        vec![
            m(300, 2000.0, 9.0),
            m(275, 1900.0, 9.1),
            m(250, 1800.0, 9.8),
            m(225, 1850.0, 10.9),
            m(200, 1900.0, 12.5),
        ]
    }

    #[test]
    fn energy_and_time() {
        assert_eq!(Selector::Energy.select(&profile()).unwrap(), 250);
        assert_eq!(Selector::Time.select(&profile()).unwrap(), 300);
    }

    #[test]
    fn ties_go_to_the_first_in_profiling_order() {
        let p = vec![m(300, 10.0, 1.0), m(250, 10.0, 1.0), m(200, 10.0, 1.0)];
        assert_eq!(Selector::Energy.select(&p).unwrap(), 300);
        assert_eq!(Selector::Time.select(&p).unwrap(), 300);
        // Equal cost: energy 10, time 1 everywhere.
        let zc = Selector::zeus_cost(0.5, 1).unwrap();
        assert_eq!(zc.select(&p).unwrap(), 300);
    }

    #[test]
    fn zeus_cost_matches_hand_computation() {
        // max_power = 300 W × 2 GPUs = 600 W.
        // η=0.5: 300: 1000+2700=3700; 275: 950+2730=3680; 250: 900+2940=3840.
        let zc = Selector::zeus_cost(0.5, 2).unwrap();
        assert_eq!(zc.select(&profile()[..3]).unwrap(), 275);
        assert_eq!(
            Selector::zeus_cost(1.0, 2)
                .unwrap()
                .select(&profile())
                .unwrap(),
            250
        );
        assert_eq!(
            Selector::zeus_cost(0.0, 2)
                .unwrap()
                .select(&profile())
                .unwrap(),
            300
        );
    }

    #[test]
    fn zeus_cost_duplicate_limit_keeps_first_slot_last_cost() {
        let p = vec![m(300, 10.0, 1.0), m(250, 100.0, 1.0), m(250, 5.0, 1.0)];
        assert_eq!(
            Selector::zeus_cost(1.0, 1).unwrap().select(&p).unwrap(),
            250
        );
    }

    #[test]
    fn zeus_cost_duplicates_in_long_profiles_behave_the_same() {
        let mut p: Vec<Measurement> = (0..40).map(|i| m(400 - i, 100.0, 1.0)).collect();
        p.push(m(390, 1.0, 1.0)); // 390 W re-measured, cheaper: keeps its slot, wins
        assert_eq!(
            Selector::zeus_cost(1.0, 1).unwrap().select(&p).unwrap(),
            390
        );
    }

    #[test]
    fn max_slowdown_uses_the_time_at_the_highest_limit() {
        let p = profile();
        let sel = |f| Selector::max_slowdown(f).unwrap().select(&p).unwrap();
        assert_eq!(sel(1.0), 300);
        assert_eq!(sel(1.02), 275);
        assert_eq!(sel(1.1), 250);
        assert_eq!(sel(1.25), 225);
        assert_eq!(sel(2.0), 200);
        // Baseline at the highest limit even when it is not the fastest.
        let q = vec![m(300, 1.0, 10.0), m(250, 1.0, 9.0), m(200, 1.0, 10.5)];
        assert_eq!(
            Selector::max_slowdown(1.0).unwrap().select(&q).unwrap(),
            250
        );
        assert_eq!(
            Selector::max_slowdown(1.05).unwrap().select(&q).unwrap(),
            200
        );
    }

    #[test]
    fn bad_parameters_name_the_value() {
        for eta in [-0.1, 1.5, f64::NAN] {
            let e = Selector::zeus_cost(eta, 1).unwrap_err();
            assert!(e.to_string().contains(&eta.to_string()), "{e}");
        }
        let e = Selector::zeus_cost(0.5, 0).unwrap_err();
        assert!(e.to_string().contains("got 0"));
        for f in [0.99, f64::NAN, f64::INFINITY] {
            let e = Selector::max_slowdown(f).unwrap_err();
            assert!(e.to_string().contains(&f.to_string()), "{e}");
        }
        assert_eq!(Selector::Energy.select(&[]), Err(SelectorError::Empty));
        let e = Selector::Time.select(&[m(300, 1.0, -2.0)]).unwrap_err();
        assert!(e.to_string().contains("time=-2"), "{e}");
    }

    fn arb_profile() -> impl Strategy<Value = Vec<Measurement>> {
        prop::collection::vec((1u32..20, 1.0f64..1e4, 0.1f64..100.0), 1..12).prop_map(|v| {
            // Distinct limits, descending, like a real profile.
            let mut pl = 400u32;
            v.into_iter()
                .map(|(dec, e, t)| {
                    pl = pl.saturating_sub(dec).max(1);
                    m(pl, e, t)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn choice_is_a_profiled_limit_and_optimal(p in arb_profile(), eta in 0.0f64..=1.0,
                                                 ws in 1i64..8, factor in 1.0f64..3.0) {
            let pls: Vec<u32> = p.iter().map(|x| x.power_limit).collect();
            let e = Selector::Energy.select(&p).unwrap();
            prop_assert!(pls.contains(&e));
            let emin = p.iter().map(|x| x.energy).fold(f64::INFINITY, f64::min);
            let first = p.iter().find(|x| x.energy == emin).unwrap();
            prop_assert_eq!(e, first.power_limit);

            let zc = Selector::zeus_cost(eta, ws).unwrap().select(&p).unwrap();
            let maxp = f64::from(*pls.iter().max().unwrap()) * ws as f64;
            let cost = |x: &Measurement| zeus_cost(x.energy, x.time, eta, maxp);
            let cmin = p.iter().map(cost).fold(f64::INFINITY, f64::min);
            prop_assert_eq!(zc, p.iter().find(|x| cost(x) == cmin).unwrap().power_limit);

            let ms = Selector::max_slowdown(factor).unwrap().select(&p).unwrap();
            let chosen = p.iter().find(|x| x.power_limit == ms).unwrap();
            prop_assert!(chosen.time <= factor * p[0].time);
            prop_assert!(p.iter().all(|x| x.time > factor * p[0].time || x.power_limit >= ms));
        }

        #[test]
        fn slowdown_is_monotone_in_factor(p in arb_profile(), f in 1.0f64..2.0, g in 0.0f64..1.0) {
            let a = Selector::max_slowdown(f).unwrap().select(&p).unwrap();
            let b = Selector::max_slowdown(f + g).unwrap().select(&p).unwrap();
            prop_assert!(b <= a);
        }
    }
}
