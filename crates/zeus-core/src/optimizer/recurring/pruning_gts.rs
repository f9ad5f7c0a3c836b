//! The Zeus batch-size optimizer of one job kept in memory (the reference's
//! `PruningGTSBatchSizeOptimizer`): the job's record, decided on by [`PruningGtsPolicy`].

use std::collections::HashMap;

use super::bandit::{Arm, BanditRng};
use super::explorer::{Exploration, ExploreStep};
use super::policy::PruningGtsPolicy;
use super::PolicyError;

/// The batch-size optimizer of one recurring job.
#[derive(Debug, Clone)]
pub struct PruningGts<R> {
    policy: PruningGtsPolicy,
    concurrency: bool,
    explorations: HashMap<u32, Vec<Exploration>>,
    /// The batch size pruning explores next (`None` once it is over or has failed).
    expecting: Option<u32>,
    /// Every reward (-cost) of each batch size, oldest first.
    rewards: HashMap<u32, Vec<f64>>,
    arms: Option<Vec<Arm>>,
    rng: R,
}

impl<R: BanditRng> PruningGts<R> {
    /// An optimizer deciding by `policy`.
    ///
    /// `concurrency`: observations of a batch size other than the one being explored (runs
    /// submitted concurrently) are ignored by pruning instead of refused.
    pub fn new(policy: PruningGtsPolicy, concurrency: bool, rng: R) -> Self {
        let explorations = HashMap::new();
        let expecting = explore_next(&policy, &explorations);
        PruningGts {
            policy,
            concurrency,
            explorations,
            expecting,
            rewards: HashMap::new(),
            arms: None,
            rng,
        }
    }

    /// The policy it decides by.
    pub fn policy(&self) -> &PruningGtsPolicy {
        &self.policy
    }

    /// Whether pruning is over and the bandit decides.
    pub fn in_bandit_stage(&self) -> bool {
        self.arms.is_some()
    }

    /// The bandit's arms, once pruning is over.
    pub fn arms(&self) -> Option<&[Arm]> {
        self.arms.as_deref()
    }

    /// The batch size pruning explores next, while it lasts.
    pub fn expecting(&self) -> Option<u32> {
        self.expecting
    }

    /// Pruning's explorations so far, per batch size, oldest first.
    pub fn explorations(&self) -> &HashMap<u32, Vec<Exploration>> {
        &self.explorations
    }

    /// The random generator (its state is part of the optimizer's).
    pub fn rng(&self) -> &R {
        &self.rng
    }

    /// The batch size of the next recurrence.
    ///
    /// # Errors
    /// [`PolicyError::NoConvergedBatchSize`] when pruning left nothing.
    pub fn predict(&mut self) -> Result<u32, PolicyError> {
        let decision = self.policy.decide(
            self.arms.as_deref(),
            &self.explorations,
            &self.rewards,
            self.policy.default_batch_size(),
            &mut self.rng,
        )?;
        if decision.new_arms.is_some() {
            self.arms = decision.new_arms;
        }
        Ok(decision.batch_size)
    }

    /// Learn the cost of a recurrence at `bs`; `converged` (whether it reached the target) is
    /// needed while pruning lasts.
    ///
    /// # Errors
    /// [`PolicyError::InvalidArgument`] for a batch size the bandit does not know or a missing
    /// `converged` during pruning; [`PolicyError::NotExpected`] (without `concurrency`) for a
    /// batch size other than the one pruning explores.
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
            let rewards = self.rewards.entry(bs).or_default();
            rewards.push(-cost);
            let arm = self.policy.fit(bs, rewards);
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
        if self.expecting != Some(bs) {
            if self.concurrency {
                self.rewards.entry(bs).or_default().push(-cost);
                return Ok(());
            }
            return Err(PolicyError::NotExpected {
                expecting: self.expecting.unwrap_or(0),
                batch_size: bs,
            });
        }
        self.rewards.entry(bs).or_default().push(-cost);
        self.explorations.entry(bs).or_default().push(Exploration {
            dispatched: false,
            converged,
            cost,
        });
        self.expecting = explore_next(&self.policy, &self.explorations);
        Ok(())
    }
}

/// The batch size pruning explores next, if any.
fn explore_next(
    policy: &PruningGtsPolicy,
    explorations: &HashMap<u32, Vec<Exploration>>,
) -> Option<u32> {
    match policy.next_exploration(explorations) {
        Ok(ExploreStep::Explore(bs)) => Some(bs),
        _ => None,
    }
}
