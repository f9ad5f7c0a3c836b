use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::*;

/// A generator that makes the bandit's draws predictable: the identity order and the mean.
struct Plain;

impl BanditRng for Plain {
    fn permutation(&mut self, n: usize) -> Vec<usize> {
        (0..n).collect()
    }
    fn normal(&mut self, loc: f64, _scale: f64) -> f64 {
        loc
    }
}

/// A cheap deterministic shuffler for property tests.
struct Lcg(u64);

impl BanditRng for Lcg {
    fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            v.swap(i, (self.0 >> 33) as usize % (i + 1));
        }
        v
    }
    fn normal(&mut self, loc: f64, scale: f64) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        loc + scale * (((self.0 >> 11) as f64 / (1u64 << 53) as f64) - 0.5)
    }
}

fn explore_all(
    bss: &[u32],
    default: u32,
    result: impl Fn(u32) -> (f64, bool),
) -> (Vec<u32>, Result<ExploreStep, PolicyError>) {
    let mut record: HashMap<u32, Vec<Exploration>> = HashMap::new();
    let mut seen = Vec::new();
    loop {
        match next_exploration(bss, default, 2, &record) {
            Ok(ExploreStep::Explore(bs)) => {
                seen.push(bs);
                let (cost, converged) = result(bs);
                record.entry(bs).or_default().push(Exploration {
                    dispatched: false,
                    converged,
                    cost,
                });
                assert!(seen.len() <= 4 * bss.len(), "{seen:?}");
            }
            other => return (seen, other),
        }
    }
}

#[test]
fn pruning_follows_the_reference_order() {
    // Round 1 from 32: down 32, 16, 8 (fails); up 64, 128 (fails). 16 is cheapest.
    // Round 2 over {16, 32, 64} from 16: down 16; up 32, 64.
    let (seen, end) = explore_all(&[8, 16, 32, 64, 128], 32, |bs| match bs {
        8 => (0.0, false),
        16 => (1.0, true),
        32 => (2.0, true),
        64 => (3.0, true),
        _ => (0.0, false),
    });
    assert_eq!(seen, vec![32, 16, 8, 64, 128, 16, 32, 64]);
    assert_eq!(end, Ok(ExploreStep::Done(vec![16, 32, 64])));
}

#[test]
fn a_dispatched_exploration_means_wait_and_no_survivor_is_an_error() {
    let mut record = HashMap::new();
    record.insert(
        16,
        vec![Exploration {
            dispatched: true,
            converged: false,
            cost: 0.0,
        }],
    );
    assert_eq!(
        next_exploration(&[8, 16], 16, 2, &record),
        Ok(ExploreStep::Wait)
    );
    let (_, end) = explore_all(&[8, 16], 16, |_| (1.0, false));
    assert_eq!(end, Err(PolicyError::NoConvergedBatchSize { round: 1 }));
    assert!(matches!(
        next_exploration(&[8, 16], 32, 2, &HashMap::new()),
        Err(PolicyError::InvalidArgument(_))
    ));
}

#[test]
fn noise_free_rewards_pin_the_mean_and_the_best_arm_wins() {
    let a = fit_arm(
        Arm::prior(1, 0.0, 0.0, f64::INFINITY),
        &[-3.0, -5.0],
        true,
        0.0,
        0.0,
    );
    assert_eq!(
        (a.mean, a.precision, a.observations),
        (-4.0, f64::INFINITY, 2)
    );
    assert_eq!(reward_precision(&[0.1, 0.1, 0.1]), f64::INFINITY);
    assert_eq!(reward_precision(&[1.0, 3.0]), 1.0);
    let b = fit_arm(
        Arm::prior(2, 0.0, 0.0, f64::INFINITY),
        &[-1.0],
        true,
        0.0,
        0.0,
    );
    for _ in 0..5 {
        assert_eq!(thompson_predict(&[a, b], 1, &mut Lcg(3)), Ok(2));
    }
    // Ties go to the first arm in order.
    assert_eq!(
        thompson_predict(&[b, Arm { batch_size: 3, ..b }], 1, &mut Plain),
        Ok(2)
    );
    assert!(thompson_predict(&[], 1, &mut Plain).is_err());
}

#[test]
fn jit_keeps_the_first_of_equal_costs() {
    let mut j = JitPowerLimit::default();
    assert_eq!(j.predict(8), None);
    j.observe(8, 250, 5.0);
    j.observe(8, 225, 5.0);
    j.observe(8, 200, 4.0);
    j.observe(8, 175, 4.5);
    assert_eq!(j.predict(8), Some(200));
}

#[test]
fn the_stop_rule_keeps_training_until_target_epochs_or_cost_bound() {
    let rule = StopRule {
        target_metric: 0.5,
        higher_is_better: true,
        max_epochs: 10,
        beta_knob: Some(2.0),
    };
    let go = decide_report(&rule, 32, 1.0, 0.1, 1, Some(10.0));
    assert!(!go.stop);
    let reached = decide_report(&rule, 32, 1.0, 0.6, 1, Some(10.0));
    assert!(reached.stop && reached.converged && reached.message == "Train succeeded");
    let over = decide_report(&rule, 32, 25.0, 0.6, 1, Some(10.0));
    assert!(over.stop && !over.converged, "{over:?}");
    assert!(over.message.contains("exceeded the cost upper bound"));
    let out = decide_report(&rule, 32, 1.0, 0.1, 10, None);
    assert!(out.stop && !out.converged && out.message.contains("max_epoch(10)"));
    let lower = StopRule {
        higher_is_better: false,
        ..rule
    };
    assert!(decide_report(&lower, 32, 1.0, 0.4, 1, None).converged);
}

#[test]
fn pruning_gts_moves_to_the_bandit_and_checks_what_it_is_told() {
    let mut p = PruningGts::new(
        PruningGtsPolicy::reference(&[8, 16, 32], 16, 0.0, 0.0, 0).unwrap(),
        false,
        Plain,
    );
    let cost = |bs: u32| f64::from(bs);
    while !p.in_bandit_stage() {
        let bs = p.predict().unwrap();
        if p.in_bandit_stage() {
            break;
        }
        p.observe(bs, cost(bs), Some(true)).unwrap();
    }
    assert_eq!(p.arms().unwrap().len(), 3);
    // Each arm's mean is minus its cost: the cheapest wins.
    assert_eq!(p.predict(), Ok(8));
    p.observe(8, 100.0, None).unwrap();
    assert_eq!(p.predict(), Ok(16));
    assert!(p.observe(64, 1.0, None).is_err());

    let mut q = PruningGts::new(
        PruningGtsPolicy::reference(&[8, 16], 16, 0.0, 0.0, 0).unwrap(),
        false,
        Plain,
    );
    assert!(
        q.observe(16, 1.0, None).is_err(),
        "converged is needed while pruning"
    );
    assert!(
        q.observe(8, 1.0, Some(true)).is_err(),
        "16 is being explored"
    );
    let mut c = PruningGts::new(
        PruningGtsPolicy::reference(&[8, 16], 16, 0.0, 0.0, 0).unwrap(),
        true,
        Plain,
    );
    assert!(
        c.observe(8, 1.0, Some(true)).is_ok(),
        "ignored under concurrency"
    );
    assert_eq!(c.predict(), Ok(16));
    assert!(PruningGtsPolicy::reference(&[8, 16], 32, 0.0, 0.0, 0).is_err());
}

#[test]
fn the_policy_waits_on_an_exploration_in_flight_and_fits_the_survivors_on_their_window() {
    let policy = PruningGtsPolicy::new(&[8, 16], 16, 1, 0.0, 0.0, 2, 2).unwrap();
    let mut explorations = HashMap::new();
    let mut rewards = HashMap::new();
    let d = policy
        .decide(None, &explorations, &rewards, 8, &mut Plain)
        .unwrap();
    assert_eq!((d.batch_size, d.kind), (16, TrialKind::Exploration));

    // 16 is in flight: another recurrence runs the best batch size so far.
    explorations.insert(
        16,
        vec![Exploration {
            dispatched: true,
            converged: false,
            cost: 0.0,
        }],
    );
    let d = policy
        .decide(None, &explorations, &rewards, 8, &mut Plain)
        .unwrap();
    assert_eq!(
        (d.batch_size, d.kind, d.new_arms),
        (8, TrialKind::Concurrent, None)
    );

    // Both converge in the one round; 16 also ran three concurrent recurrences.
    explorations.insert(
        16,
        vec![Exploration {
            dispatched: false,
            converged: true,
            cost: 4.0,
        }],
    );
    explorations.insert(
        8,
        vec![Exploration {
            dispatched: false,
            converged: true,
            cost: 9.0,
        }],
    );
    rewards.insert(16, vec![-4.0, -1.0, -2.0, -3.0]);
    rewards.insert(8, vec![-9.0]);
    let d = policy
        .decide(None, &explorations, &rewards, 8, &mut Plain)
        .unwrap();
    let arms = d.new_arms.expect("pruning is over");
    assert_eq!(d.kind, TrialKind::Bandit);
    // Each arm is fitted on its last two rewards (the window), from the prior.
    assert_eq!(arms[0], policy.fit(8, &[-9.0]));
    assert_eq!(arms[1].observations, 2);
    assert_eq!(arms[1].mean, -2.5);
    // The bandit explores the arm seen once before it samples.
    assert_eq!(d.batch_size, 8);
    let next = policy
        .decide(Some(&arms), &explorations, &rewards, 8, &mut Plain)
        .unwrap();
    assert_eq!((next.batch_size, next.new_arms), (8, None));
}

#[test]
fn concurrent_observations_count_toward_the_arms_but_not_toward_pruning() {
    let policy = PruningGtsPolicy::new(&[8, 16], 16, 1, 0.0, 0.0, 1, 0).unwrap();
    let mut p = PruningGts::new(policy, true, Plain);
    assert_eq!(p.predict(), Ok(16));
    p.observe(8, 7.0, Some(true)).unwrap(); // a concurrent run: pruning still expects 16
    assert_eq!(p.expecting(), Some(16));
    p.observe(16, 5.0, Some(true)).unwrap();
    assert_eq!(p.predict(), Ok(8));
    p.observe(8, 9.0, Some(true)).unwrap();
    p.predict().unwrap();
    let arms = p.arms().expect("pruning is over");
    assert_eq!(
        arms[0].observations, 2,
        "the concurrent run and the exploration"
    );
    assert_eq!(arms[0].mean, -8.0);
    let mut strict = PruningGts::new(
        PruningGtsPolicy::new(&[8, 16], 16, 1, 0.0, 0.0, 1, 0).unwrap(),
        false,
        Plain,
    );
    assert_eq!(
        strict.observe(8, 7.0, Some(true)),
        Err(PolicyError::NotExpected {
            expecting: 16,
            batch_size: 8
        })
    );
}

proptest! {
    #[test]
    fn fitting_one_by_one_equals_fitting_at_once(
        rewards in proptest::collection::vec(-1e3f64..1e3, 1..20),
        rp in 0.01f64..10.0,
    ) {
        let prior = Arm::prior(1, 0.0, 0.0, rp);
        let at_once = fit_arm(prior, &rewards, true, 0.0, 0.0);
        let mut one_by_one = prior;
        for r in &rewards {
            one_by_one = fit_arm(one_by_one, &[*r], false, 0.0, 0.0);
        }
        prop_assert!((at_once.mean - one_by_one.mean).abs() <= 1e-6 * (1.0 + at_once.mean.abs()));
        prop_assert!((at_once.precision - one_by_one.precision).abs() <= 1e-9 * at_once.precision);
        prop_assert_eq!(at_once.observations, rewards.len());
    }

    #[test]
    fn exploration_visits_every_arm_first(n in 1usize..10, seed in 0u64..1000) {
        let mut arms: Vec<Arm> = (1..=n as u32).map(|b| Arm::prior(b, 0.0, 0.0, 1.0)).collect();
        let mut rng = Lcg(seed);
        let mut seen = HashSet::new();
        for _ in 0..n {
            let bs = thompson_predict(&arms, 1, &mut rng).unwrap();
            prop_assert!(seen.insert(bs));
            let i = arms.iter().position(|a| a.batch_size == bs).unwrap();
            arms[i] = fit_arm(arms[i], &[0.0], false, 0.0, 0.0);
        }
    }

    #[test]
    fn pruning_survivors_all_reached_the_target(
        results in proptest::collection::vec((0.0f64..100.0, any::<bool>()), 6),
        d in 0usize..6,
    ) {
        let bss = [4u32, 8, 16, 32, 64, 128];
        let (_, end) = explore_all(&bss, bss[d], |bs| {
            results[bss.iter().position(|&b| b == bs).unwrap()]
        });
        if let Ok(ExploreStep::Done(survivors)) = end {
            for s in survivors {
                prop_assert!(results[bss.iter().position(|&b| b == s).unwrap()].1);
            }
        } else {
            let no_survivor = matches!(end, Err(PolicyError::NoConvergedBatchSize { .. }));
            prop_assert!(no_survivor, "{:?}", end);
        }
    }
}
