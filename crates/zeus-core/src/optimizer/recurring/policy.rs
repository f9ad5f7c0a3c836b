//! The Zeus batch-size policy as one set of rules over a job's record: pruning exploration
//! while it lasts, then Gaussian Thompson sampling over the survivors.
//!
//! [`PruningGtsPolicy::decide`] is stateless (the job's record and random generator in, the
//! next trial and any new arms out), so the batch-size optimizer server, which keeps each job
//! in a database, and [`super::PruningGts`], which keeps one in memory for `zeus.policy` and the
//! trace simulator, decide through the same code.

use std::collections::HashMap;

use super::bandit::{fit_arm, reward_precision, thompson_predict, Arm, BanditRng};
use super::explorer::{next_exploration, Exploration, ExploreStep};
use super::PolicyError;

/// What kind of trial a decision starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrialKind {
    /// Pruning explores this batch size.
    Exploration,
    /// An exploration is in flight: this recurrence runs the best batch size so far.
    Concurrent,
    /// The bandit chose it.
    Bandit,
}

/// The next trial of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub batch_size: u32,
    pub kind: TrialKind,
    /// The bandit's arms when this decision ended pruning (the caller keeps them from now on).
    pub new_arms: Option<Vec<Arm>>,
}

/// Pruning rounds of the reference's in-memory optimizer.
pub const REFERENCE_PRUNING_ROUNDS: usize = 2;

/// Pulls each surviving batch size gets from the reference's bandit before it samples (the
/// pruning rounds already observed each twice, so it samples from the start).
pub const REFERENCE_BANDIT_EXPLORATIONS: usize = 2;

/// A job's settings of the pruning + Gaussian Thompson sampling policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PruningGtsPolicy {
    batch_sizes: Vec<u32>,
    default: u32,
    pruning_rounds: usize,
    prior_mean: f64,
    prior_precision: f64,
    bandit_explorations: usize,
    window_size: usize,
}

impl PruningGtsPolicy {
    /// The policy of a job over `batch_sizes` starting from `default`.
    ///
    /// `bandit_explorations`: pulls each arm gets before the bandit samples. `window_size`:
    /// each arm is fitted on its last `window_size` rewards (0: all of them).
    ///
    /// # Errors
    /// [`PolicyError::InvalidArgument`] for no batch sizes or a default not among them.
    pub fn new(
        batch_sizes: &[u32],
        default: u32,
        pruning_rounds: usize,
        prior_mean: f64,
        prior_precision: f64,
        bandit_explorations: usize,
        window_size: usize,
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
        Ok(PruningGtsPolicy {
            batch_sizes: sorted,
            default,
            pruning_rounds,
            prior_mean,
            prior_precision,
            bandit_explorations,
            window_size,
        })
    }

    /// The reference's in-memory optimizer (`PruningGTSBatchSizeOptimizer`): two pruning
    /// rounds, two bandit explorations per arm.
    ///
    /// # Errors
    /// As [`PruningGtsPolicy::new`].
    pub fn reference(
        batch_sizes: &[u32],
        default: u32,
        prior_mean: f64,
        prior_precision: f64,
        window_size: usize,
    ) -> Result<Self, PolicyError> {
        Self::new(
            batch_sizes,
            default,
            REFERENCE_PRUNING_ROUNDS,
            prior_mean,
            prior_precision,
            REFERENCE_BANDIT_EXPLORATIONS,
            window_size,
        )
    }

    /// The candidate batch sizes, ascending.
    pub fn batch_sizes(&self) -> &[u32] {
        &self.batch_sizes
    }

    /// The batch size pruning starts from.
    pub fn default_batch_size(&self) -> u32 {
        self.default
    }

    /// The rewards an arm is fitted on: the last `window_size` of them (all when it is 0).
    pub fn window<'a>(&self, rewards: &'a [f64]) -> &'a [f64] {
        let skip = if self.window_size > 0 {
            rewards.len().saturating_sub(self.window_size)
        } else {
            0
        };
        &rewards[skip..]
    }

    /// The arm of `batch_size` fitted from the prior on its window of `rewards` (oldest first),
    /// its reward precision learned from them.
    pub fn fit(&self, batch_size: u32, rewards: &[f64]) -> Arm {
        let rewards = self.window(rewards);
        let arm = Arm::prior(
            batch_size,
            self.prior_mean,
            self.prior_precision,
            reward_precision(rewards),
        );
        fit_arm(arm, rewards, true, self.prior_mean, self.prior_precision)
    }

    /// Pruning's next step over the job's explorations (per batch size, oldest first).
    ///
    /// # Errors
    /// [`PolicyError::NoConvergedBatchSize`] when a round left no batch size.
    pub fn next_exploration(
        &self,
        explorations: &HashMap<u32, Vec<Exploration>>,
    ) -> Result<ExploreStep, PolicyError> {
        next_exploration(
            &self.batch_sizes,
            self.default,
            self.pruning_rounds,
            explorations,
        )
    }

    /// The next trial of a job.
    ///
    /// `arms`: the bandit's arms once pruning is over (`None` before). `explorations`: the
    /// job's exploration trials; `rewards`: minus the cost of every finished trial per batch
    /// size, oldest first (both read only while pruning lasts). `best_so_far`: the batch size a
    /// recurrence runs while an exploration is in flight. The generator advances only when the
    /// bandit decides.
    ///
    /// # Errors
    /// [`PolicyError::NoConvergedBatchSize`] when pruning left nothing.
    pub fn decide<R: BanditRng + ?Sized>(
        &self,
        arms: Option<&[Arm]>,
        explorations: &HashMap<u32, Vec<Exploration>>,
        rewards: &HashMap<u32, Vec<f64>>,
        best_so_far: u32,
        rng: &mut R,
    ) -> Result<Decision, PolicyError> {
        if let Some(arms) = arms {
            return Ok(Decision {
                batch_size: thompson_predict(arms, self.bandit_explorations, rng)?,
                kind: TrialKind::Bandit,
                new_arms: None,
            });
        }
        let survivors = match self.next_exploration(explorations)? {
            ExploreStep::Explore(bs) => {
                return Ok(Decision {
                    batch_size: bs,
                    kind: TrialKind::Exploration,
                    new_arms: None,
                })
            }
            ExploreStep::Wait => {
                return Ok(Decision {
                    batch_size: best_so_far,
                    kind: TrialKind::Concurrent,
                    new_arms: None,
                })
            }
            ExploreStep::Done(survivors) => survivors,
        };
        let new_arms: Vec<Arm> = survivors
            .iter()
            .map(|&bs| {
                let r = rewards.get(&bs).map(Vec::as_slice).unwrap_or_default();
                self.fit(bs, r)
            })
            .collect();
        Ok(Decision {
            batch_size: thompson_predict(&new_arms, self.bandit_explorations, rng)?,
            kind: TrialKind::Bandit,
            new_arms: Some(new_arms),
        })
    }
}
