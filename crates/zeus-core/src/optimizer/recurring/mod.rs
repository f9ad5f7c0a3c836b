//! The recurring-job policy of Zeus (NSDI'23), once for every caller: the batch-size optimizer
//! server, `zeus.policy` and the trace simulator.
//!
//! A job recurs; each recurrence runs with one batch size and power limit and reports its cost.
//! The batch size comes from pruning exploration ([`explorer`]: each candidate is tried from the
//! default outwards, those that miss the target are dropped, twice over) and then from Gaussian
//! Thompson sampling over the survivors ([`bandit`]). The power limit comes from just-in-time
//! profiling ([`jit`]): the cheapest profiled limit of a batch size wins. A recurrence stops
//! early once its cost passes `beta` times the cheapest so far ([`report`]).
//!
//! [`simulator`] replays recurring jobs over measured traces (the paper's evaluation).
//!
//! The batch-size rules are composed once, in [`policy`]: stateless (a job's record and a
//! savable random state in, the next decision out), so the server keeps its jobs in a
//! database and decides through it, and [`PruningGts`] keeps one job in memory for
//! `zeus.policy` and the simulator and decides through it too.
//!
//! Random numbers come from [`crate::util::numpy_rng::NumpyRng`], which reproduces numpy's
//! `default_rng` draw for draw, so seeded runs make exactly the reference's decisions.

pub mod bandit;
pub mod explorer;
pub mod jit;
pub mod policy;
mod pruning_gts;
pub mod report;
pub mod simulator;

pub use bandit::{fit_arm, reward_precision, thompson_predict, Arm, BanditRng};
pub use explorer::{next_exploration, Exploration, ExploreStep};
pub use jit::JitPowerLimit;
pub use policy::{Decision, PruningGtsPolicy, TrialKind};
pub use pruning_gts::PruningGts;
pub use report::{decide_report, ReportDecision, StopRule};

/// Errors of the recurring-job policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// A pruning round ended with no batch size that reached the target.
    #[error(
        "No batch size converged in pruning round {round}; relax target_metric, max_epochs or \
         beta_knob and register a new job"
    )]
    NoConvergedBatchSize { round: usize },
    /// An observation of a batch size other than the one pruning explores.
    #[error("PruningExploreManager: self.expecting={expecting}, batch_size={batch_size}")]
    NotExpected { expecting: u32, batch_size: u32 },
    /// An argument is outside what the policy accepts.
    #[error("{0}")]
    InvalidArgument(String),
}

#[cfg(test)]
mod tests;
