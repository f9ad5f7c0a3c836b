//! The NSDI'23 policies in Rust, for the simulator's fast path: pruning exploration followed by
//! Gaussian Thompson sampling over batch sizes, and the just-in-time power-limit optimizer.
//!
//! They follow the reference's decision rules and its order of random draws (a permutation of the
//! arms on every prediction, then one normal sample per arm), but draw from `rand_pcg::Pcg64`, so
//! trajectories agree with the reference statistically, not bit for bit.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use rand_pcg::Pcg64;

use super::trace::{SimError, SimResult};

/// Chooses the batch size of each run of a recurring job.
pub trait BatchSizePolicy {
    /// The batch size for the next run.
    fn predict(&mut self) -> SimResult<u32>;
    /// Learn the cost of a run at `bs` and whether it reached the target.
    fn observe(&mut self, bs: u32, cost: f64, reached: bool) -> SimResult<()>;
}

/// Chooses the power limit of each run.
pub trait PowerLimitPolicy {
    /// The power limit for `bs`, or `None` when `bs` still needs profiling.
    fn predict(&mut self, bs: u32) -> SimResult<Option<u32>>;
    /// Learn the epoch cost of `bs` at `pl`.
    fn observe(&mut self, bs: u32, pl: u32, cost: f64) -> SimResult<()>;
}

/// Population variance (numpy's `var` with `ddof=0`).
pub fn variance(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n
}

/// One arm's belief: a Gaussian over its mean reward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arm {
    /// The arm (a batch size).
    pub value: u32,
    /// Precision of one reward observation.
    pub reward_prec: f64,
    /// Posterior mean.
    pub mean: f64,
    /// Posterior precision.
    pub prec: f64,
    /// Observations fitted.
    pub count: usize,
}

/// Gaussian Thompson sampling with a conjugate Gaussian prior and known reward precision.
#[derive(Debug, Clone)]
pub struct GaussianTs {
    /// Arms in the order the user gave.
    pub arms: Vec<Arm>,
    prior_mean: f64,
    prior_prec: f64,
    num_exploration: usize,
    rng: Pcg64,
}

impl GaussianTs {
    /// A bandit over `arms`, all with reward precision `reward_prec`.
    pub fn new(
        arms: &[u32],
        reward_prec: f64,
        prior_mean: f64,
        prior_prec: f64,
        num_exploration: usize,
        seed: u64,
    ) -> Self {
        GaussianTs {
            arms: arms
                .iter()
                .map(|&value| Arm {
                    value,
                    reward_prec,
                    mean: prior_mean,
                    prec: prior_prec,
                    count: 0,
                })
                .collect(),
            prior_mean,
            prior_prec,
            num_exploration,
            rng: Pcg64::seed_from_u64(seed),
        }
    }

    fn arm_mut(&mut self, arm: u32) -> SimResult<&mut Arm> {
        self.arms
            .iter_mut()
            .find(|a| a.value == arm)
            .ok_or_else(|| SimError::InvalidArgument(format!("unknown bandit arm {arm}")))
    }

    /// Set the reward precision of one arm.
    pub fn set_reward_prec(&mut self, arm: u32, prec: f64) -> SimResult<()> {
        self.arm_mut(arm)?.reward_prec = prec;
        Ok(())
    }

    /// Conjugate update of one arm with `rewards`, optionally from the prior.
    pub fn fit_arm(&mut self, arm: u32, rewards: &[f64], reset: bool) -> SimResult<()> {
        let (pm, pp) = (self.prior_mean, self.prior_prec);
        let a = self.arm_mut(arm)?;
        if reset {
            a.mean = pm;
            a.prec = pp;
            a.count = 0;
        }
        if rewards.is_empty() {
            return Ok(());
        }
        let n = rewards.len() as f64;
        let sum: f64 = rewards.iter().sum();
        if a.reward_prec == f64::INFINITY {
            // Noise-free rewards: the mean is known exactly.
            a.prec = f64::INFINITY;
            a.mean = sum / n;
        } else {
            let new_prec = a.prec + n * a.reward_prec;
            a.mean = (a.prec * a.mean + a.reward_prec * sum) / new_prec;
            a.prec = new_prec;
        }
        a.count += rewards.len();
        Ok(())
    }

    /// The arm to pull next.
    ///
    /// Like the reference, a random permutation of the arms is drawn on every call (also after
    /// exploration), then each arm's mean is sampled in arm order and the first maximum wins.
    pub fn predict(&mut self) -> u32 {
        let mut order: Vec<usize> = (0..self.arms.len()).collect();
        order.shuffle(&mut self.rng);
        if let Some(&i) = order
            .iter()
            .find(|&&i| self.arms[i].count < self.num_exploration)
        {
            return self.arms[i].value;
        }
        let mut best = (f64::NEG_INFINITY, self.arms[0].value);
        let mut first = true;
        for a in &self.arms {
            let z: f64 = StandardNormal.sample(&mut self.rng);
            let sample = a.mean + z * (1.0 / a.prec).sqrt();
            if first || sample > best.0 {
                best = (sample, a.value);
                first = false;
            }
        }
        best.1
    }
}

/// The pruning exploration of the batch-size space (the reference's `PruningExploreManager`),
/// as an explicit state machine instead of a generator.
#[derive(Debug, Clone)]
pub struct PruningExplorer {
    batch_sizes: Vec<u32>,
    default: u32,
    rounds_left: usize,
    // Current round.
    down: Vec<u32>,
    up: Vec<u32>,
    in_up: bool,
    pos: usize,
    good: Vec<u32>,
    best_cost: f64,
    /// The batch size whose result is expected next; `None` once exploration is over.
    pub expecting: Option<u32>,
}

impl PruningExplorer {
    /// Start pruning `batch_sizes` (ascending) from `default` for `rounds` rounds.
    pub fn new(batch_sizes: &[u32], default: u32, rounds: usize) -> SimResult<Self> {
        if !batch_sizes.contains(&default) {
            return Err(SimError::InvalidArgument(format!(
                "default batch size {default} not in {batch_sizes:?}"
            )));
        }
        let mut bss = batch_sizes.to_vec();
        bss.sort_unstable();
        let mut s = PruningExplorer {
            batch_sizes: bss,
            default,
            rounds_left: rounds,
            down: vec![],
            up: vec![],
            in_up: false,
            pos: 0,
            good: vec![],
            best_cost: f64::INFINITY,
            expecting: None,
        };
        s.start_round();
        Ok(s)
    }

    fn start_round(&mut self) {
        if self.rounds_left == 0 {
            self.expecting = None;
            return;
        }
        self.rounds_left -= 1;
        let idx = self
            .batch_sizes
            .iter()
            .position(|&b| b == self.default)
            .unwrap_or(0);
        self.down = self.batch_sizes[..=idx].iter().rev().copied().collect();
        self.up = self.batch_sizes[idx + 1..].to_vec();
        self.in_up = false;
        self.pos = 0;
        self.good.clear();
        self.best_cost = f64::INFINITY;
        self.advance();
    }

    /// Point `expecting` at the next batch size, finishing the round when both directions are done.
    fn advance(&mut self) {
        loop {
            let list = if self.in_up { &self.up } else { &self.down };
            if self.pos < list.len() {
                self.expecting = Some(list[self.pos]);
                return;
            }
            if !self.in_up {
                self.in_up = true;
                self.pos = 0;
                continue;
            }
            // Round over: survivors become the next round's space.
            let mut good = std::mem::take(&mut self.good);
            good.sort_unstable();
            self.batch_sizes = good;
            if self.batch_sizes.is_empty() {
                self.rounds_left = 0;
            }
            self.start_round();
            return;
        }
    }

    /// The next batch size to explore, or `None` when pruning is over.
    pub fn next_batch_size(&self) -> Option<u32> {
        self.expecting
    }

    /// Report the result of exploring `bs`, which must be the expected one.
    pub fn report(&mut self, bs: u32, cost: f64, reached: bool) -> SimResult<()> {
        if self.expecting != Some(bs) {
            return Err(SimError::InvalidArgument(format!(
                "pruning exploration expected batch size {:?}, got {bs}",
                self.expecting
            )));
        }
        if reached {
            if self.best_cost > cost {
                self.best_cost = cost;
                self.default = bs;
            }
            self.good.push(bs);
            self.pos += 1;
        } else {
            // A failure ends this direction: larger (or smaller) ones will not do better.
            if self.in_up {
                self.pos = self.up.len();
            } else {
                self.pos = self.down.len();
            }
        }
        self.advance();
        Ok(())
    }

    /// The surviving batch sizes, ascending (final once `next_batch_size` is `None`).
    pub fn survivors(&self) -> &[u32] {
        &self.batch_sizes
    }
}

/// Pruning exploration, then Gaussian Thompson sampling over the survivors (the paper's BSO).
#[derive(Debug, Clone)]
pub struct PruningGts {
    explorer: PruningExplorer,
    mab: Option<GaussianTs>,
    history: Vec<(u32, f64)>,
    prior_mean: f64,
    prior_prec: f64,
    window_size: usize,
    seed: u64,
}

impl PruningGts {
    /// A fresh optimizer over `batch_sizes` starting from `default`.
    pub fn new(
        batch_sizes: &[u32],
        default: u32,
        prior_mean: f64,
        prior_prec: f64,
        window_size: usize,
        seed: u64,
    ) -> SimResult<Self> {
        if batch_sizes.is_empty() {
            return Err(SimError::InvalidArgument("empty batch size list".into()));
        }
        Ok(PruningGts {
            explorer: PruningExplorer::new(batch_sizes, default, 2)?,
            mab: None,
            history: vec![],
            prior_mean,
            prior_prec,
            window_size,
            seed,
        })
    }

    /// Most recent rewards of `bs` (all of them when the window is 0), oldest first.
    fn window(&self, bs: u32) -> Vec<f64> {
        let mut r: Vec<f64> = Vec::new();
        for &(b, reward) in self.history.iter().rev() {
            if b == bs {
                r.push(reward);
                if r.len() == self.window_size {
                    break;
                }
            }
        }
        r.reverse();
        r
    }

    fn build_mab(&mut self) -> SimResult<()> {
        let arms = self.explorer.survivors().to_vec();
        if arms.is_empty() {
            return Err(SimError::InvalidArgument(
                "every batch size was pruned; no batch size reached the target".into(),
            ));
        }
        let mut mab = GaussianTs::new(&arms, 0.0, self.prior_mean, self.prior_prec, 2, self.seed);
        for &bs in &arms {
            let rewards = self.window(bs);
            mab.set_reward_prec(bs, 1.0 / variance(&rewards))?;
            mab.fit_arm(bs, &rewards, true)?;
        }
        self.mab = Some(mab);
        Ok(())
    }

    /// Whether exploration is over and the bandit decides.
    pub fn in_ts_stage(&self) -> bool {
        self.mab.is_some()
    }
}

impl BatchSizePolicy for PruningGts {
    fn predict(&mut self) -> SimResult<u32> {
        if let Some(bs) = self.explorer.next_batch_size() {
            return Ok(bs);
        }
        if self.mab.is_none() {
            self.build_mab()?;
        }
        Ok(self.mab.as_mut().map(|m| m.predict()).unwrap_or(0))
    }

    fn observe(&mut self, bs: u32, cost: f64, reached: bool) -> SimResult<()> {
        self.history.push((bs, -cost));
        let rewards = if self.mab.is_some() {
            self.window(bs)
        } else {
            Vec::new()
        };
        if let Some(mab) = self.mab.as_mut() {
            mab.set_reward_prec(bs, 1.0 / variance(&rewards))?;
            mab.fit_arm(bs, &rewards, true)
        } else {
            self.explorer.report(bs, cost, reached)
        }
    }
}

/// The just-in-time power-limit optimizer: remember the cheapest profiled power limit per batch
/// size; on a tie the first observed (the higher one, as profiling goes high to low) wins.
#[derive(Debug, Clone, Default)]
pub struct JitPowerLimit {
    best: std::collections::HashMap<u32, (u32, f64)>,
}

impl PowerLimitPolicy for JitPowerLimit {
    fn predict(&mut self, bs: u32) -> SimResult<Option<u32>> {
        Ok(self.best.get(&bs).map(|b| b.0))
    }

    fn observe(&mut self, bs: u32, pl: u32, cost: f64) -> SimResult<()> {
        match self.best.get(&bs) {
            Some(&(_, c)) if c <= cost => {}
            _ => {
                self.best.insert(bs, (pl, cost));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pruning_follows_reference_order() {
        // bss 8..128, default 32. Round 1: down 32,16,8 ; up 64,128.
        let mut p = PruningExplorer::new(&[8, 16, 32, 64, 128], 32, 2).unwrap();
        let mut seen = vec![];
        // costs: 16 cheapest; 8 fails; 128 fails.
        let res = |bs: u32| -> (f64, bool) {
            match bs {
                8 => (0.0, false),
                16 => (1.0, true),
                32 => (2.0, true),
                64 => (3.0, true),
                _ => (0.0, false),
            }
        };
        while let Some(bs) = p.next_batch_size() {
            seen.push(bs);
            let (c, r) = res(bs);
            p.report(bs, c, r).unwrap();
        }
        // Round 2 over {16,32,64} from default 16: down 16 ; up 32, 64.
        assert_eq!(seen, vec![32, 16, 8, 64, 128, 16, 32, 64]);
        assert_eq!(p.survivors(), &[16, 32, 64]);
    }

    #[test]
    fn pruning_rejects_unexpected_report() {
        let mut p = PruningExplorer::new(&[8, 16], 16, 2).unwrap();
        assert!(p.report(8, 1.0, true).is_err());
        assert!(PruningExplorer::new(&[8, 16], 32, 2).is_err());
    }

    #[test]
    fn jit_keeps_first_of_ties() {
        let mut j = JitPowerLimit::default();
        assert_eq!(j.predict(8).unwrap(), None);
        j.observe(8, 250, 5.0).unwrap();
        j.observe(8, 225, 5.0).unwrap();
        j.observe(8, 200, 4.0).unwrap();
        j.observe(8, 175, 4.5).unwrap();
        assert_eq!(j.predict(8).unwrap(), Some(200));
    }

    #[test]
    fn infinite_precision_means_exact_mean() {
        let mut ts = GaussianTs::new(&[1, 2], f64::INFINITY, 0.0, 0.0, 0, 7);
        ts.fit_arm(1, &[-3.0, -5.0], true).unwrap();
        ts.fit_arm(2, &[-1.0], true).unwrap();
        assert_eq!(ts.arms[0].mean, -4.0);
        for _ in 0..20 {
            assert_eq!(ts.predict(), 2);
        }
    }

    proptest! {
        #[test]
        fn conjugate_update_matches_batch(rewards in proptest::collection::vec(-1e3f64..1e3, 1..20), rp in 0.01f64..10.0) {
            // Fitting one by one equals fitting all at once.
            let mut a = GaussianTs::new(&[1], rp, 0.0, 0.0, 1, 1);
            let mut b = a.clone();
            a.fit_arm(1, &rewards, true).unwrap();
            for r in &rewards { b.fit_arm(1, &[*r], false).unwrap(); }
            let (x, y) = (a.arms[0], b.arms[0]);
            prop_assert!((x.mean - y.mean).abs() <= 1e-6 * (1.0 + x.mean.abs()));
            prop_assert!((x.prec - y.prec).abs() <= 1e-9 * x.prec);
            prop_assert_eq!(x.count, rewards.len());
        }

        #[test]
        fn exploration_visits_every_arm_first(n in 1usize..10, seed in 0u64..1000) {
            let arms: Vec<u32> = (1..=n as u32).collect();
            let mut ts = GaussianTs::new(&arms, 1.0, 0.0, 0.0, 1, seed);
            let mut seen = std::collections::HashSet::new();
            for _ in 0..n {
                let a = ts.predict();
                prop_assert!(seen.insert(a));
                ts.fit_arm(a, &[0.0], false).unwrap();
            }
        }

        #[test]
        fn pruning_survivors_all_reached(costs in proptest::collection::vec((0.0f64..100.0, any::<bool>()), 6), d in 0usize..6) {
            let bss = [4u32, 8, 16, 32, 64, 128];
            let mut p = PruningExplorer::new(&bss, bss[d], 2).unwrap();
            let mut steps = 0;
            while let Some(bs) = p.next_batch_size() {
                let i = bss.iter().position(|&b| b == bs).unwrap();
                p.report(bs, costs[i].0, costs[i].1).unwrap();
                steps += 1;
                prop_assert!(steps <= 12);
            }
            for s in p.survivors() {
                let i = bss.iter().position(|b| b == s).unwrap();
                prop_assert!(costs[i].1);
            }
        }
    }
}
