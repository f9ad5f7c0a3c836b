//! The Zeus batch-size optimizer of one job, in memory: pruning exploration, then Gaussian
//! Thompson sampling over the survivors (the reference's `PruningGTSBatchSizeOptimizer`).

use std::collections::HashMap;

use super::bandit::{fit_arm, reward_precision, thompson_predict, Arm, BanditRng};
use super::explorer::{next_exploration, Exploration, ExploreStep};
use super::PolicyError;

/// Pulls each surviving batch size gets from the bandit before sampling (the pruning rounds
/// already observed each twice, so the bandit samples from the start).
const BANDIT_EXPLORATIONS: usize = 2;

/// Pruning rounds, as in the reference.
const PRUNING_ROUNDS: usize = 2;

/// The batch-size optimizer of one recurring job.
#[derive(Debug, Clone)]
pub struct PruningGts<R> {
    batch_sizes: Vec<u32>,
    default: u32,
    explorations: HashMap<u32, Vec<Exploration>>,
    /// Pruning's next step for the explorations so far (recomputed when they change); an
    /// error (no batch size survived) is reported by the next `predict`.
    step: Result<ExploreStep, PolicyError>,
    /// Every reward (-cost) of each batch size, oldest first.
    rewards: HashMap<u32, Vec<f64>>,
    arms: Option<Vec<Arm>>,
    prior_mean: f64,
    prior_precision: f64,
    window_size: usize,
    concurrency: bool,
    rng: R,
}

impl<R: BanditRng> PruningGts<R> {
    /// An optimizer over `batch_sizes` starting from `default`.
    ///
    /// `window_size`: the bandit fits each arm on its last `window_size` rewards (0: all).
    /// `concurrency`: observations of a batch size other than the one being explored (runs
    /// submitted concurrently) are ignored by pruning instead of refused.
    ///
    /// # Errors
    /// [`PolicyError::InvalidArgument`] for no batch sizes or a default not among them.
    pub fn new(
        batch_sizes: &[u32],
        default: u32,
        prior_mean: f64,
        prior_precision: f64,
        window_size: usize,
        concurrency: bool,
        rng: R,
    ) -> Result<Self, PolicyError> {
        if batch_sizes.is_empty() {
            return Err(PolicyError::InvalidArgument(
                "the batch size list is empty".into(),
            ));
        }
        if !batch_sizes.contains(&default) {
            return Err(PolicyError::InvalidArgument(format!(
                "Default batch size {default} not in {batch_sizes:?}."
            )));
        }
        let mut sorted = batch_sizes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let explorations = HashMap::new();
        let step = next_exploration(&sorted, default, PRUNING_ROUNDS, &explorations);
        Ok(PruningGts {
            step,
            batch_sizes: sorted,
            default,
            explorations,
            rewards: HashMap::new(),
            arms: None,
            prior_mean,
            prior_precision,
            window_size,
            concurrency,
            rng,
        })
    }

    /// Whether pruning is over and the bandit decides.
    pub fn in_bandit_stage(&self) -> bool {
        self.arms.is_some()
    }

    /// The bandit's arms, once pruning is over.
    pub fn arms(&self) -> Option<&[Arm]> {
        self.arms.as_deref()
    }

    /// The random generator (its state is part of the optimizer's).
    pub fn rng(&self) -> &R {
        &self.rng
    }

    /// The most recent rewards of `bs` (all of them when the window is 0), oldest first.
    fn window(&self, bs: u32) -> &[f64] {
        let all = self.rewards.get(&bs).map(Vec::as_slice).unwrap_or_default();
        let skip = if self.window_size > 0 {
            all.len().saturating_sub(self.window_size)
        } else {
            0
        };
        &all[skip..]
    }

    fn fitted(&self, bs: u32, rewards: &[f64]) -> Arm {
        let arm = Arm::prior(
            bs,
            self.prior_mean,
            self.prior_precision,
            reward_precision(rewards),
        );
        fit_arm(arm, rewards, true, self.prior_mean, self.prior_precision)
    }

    fn build_arms(&mut self, survivors: &[u32]) -> Result<(), PolicyError> {
        let mut arms = Vec::with_capacity(survivors.len());
        for &bs in survivors {
            let rewards = self.window(bs);
            if rewards.len() < 2 {
                return Err(PolicyError::InvalidArgument(format!(
                    "Number of observations for {bs} is {}.",
                    rewards.len()
                )));
            }
            arms.push(self.fitted(bs, rewards));
        }
        self.arms = Some(arms);
        Ok(())
    }

    /// The batch size of the next recurrence.
    ///
    /// # Errors
    /// [`PolicyError::NoConvergedBatchSize`] when pruning left nothing.
    pub fn predict(&mut self) -> Result<u32, PolicyError> {
        if self.arms.is_none() {
            match self.step.clone()? {
                ExploreStep::Explore(bs) => return Ok(bs),
                ExploreStep::Wait => unreachable!("in-memory explorations are never dispatched"),
                ExploreStep::Done(survivors) => self.build_arms(&survivors)?,
            }
        }
        let arms = self.arms.as_deref().unwrap_or_default();
        thompson_predict(arms, BANDIT_EXPLORATIONS, &mut self.rng)
    }

    /// Learn the cost of a recurrence at `bs`; `converged` (whether it reached the target) is
    /// needed while pruning lasts.
    ///
    /// # Errors
    /// [`PolicyError::InvalidArgument`] for a batch size the bandit does not know, a missing
    /// `converged` during pruning, or (without `concurrency`) a batch size other than the one
    /// pruning explores.
    pub fn observe(
        &mut self,
        bs: u32,
        cost: f64,
        converged: Option<bool>,
    ) -> Result<(), PolicyError> {
        if let Some(arms) = &self.arms {
            let Some(i) = arms.iter().position(|a| a.batch_size == bs) else {
                let known: Vec<u32> = arms.iter().map(|a| a.batch_size).collect();
                return Err(PolicyError::InvalidArgument(format!(
                    "Unknown arm {bs}; arms are {known:?}"
                )));
            };
            self.rewards.entry(bs).or_default().push(-cost);
            let arm = self.fitted(bs, self.window(bs));
            if let Some(arms) = self.arms.as_mut() {
                arms[i] = arm;
            }
            return Ok(());
        }
        let converged = converged.ok_or_else(|| {
            PolicyError::InvalidArgument(
                "observe needs `converged` during pruning exploration".into(),
            )
        })?;
        self.rewards.entry(bs).or_default().push(-cost);
        let expecting = match self.step {
            Ok(ExploreStep::Explore(e)) => e,
            _ => 0,
        };
        if expecting != bs {
            if self.concurrency {
                return Ok(());
            }
            return Err(PolicyError::InvalidArgument(format!(
                "PruningExploreManager: self.expecting={expecting}, batch_size={bs}"
            )));
        }
        self.explorations.entry(bs).or_default().push(Exploration {
            dispatched: false,
            converged,
            cost,
        });
        self.step = next_exploration(
            &self.batch_sizes,
            self.default,
            PRUNING_ROUNDS,
            &self.explorations,
        );
        Ok(())
    }
}
