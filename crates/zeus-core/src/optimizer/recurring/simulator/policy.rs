//! The simulator's plug-in points: what chooses the batch size and the power limit of each
//! run. The Zeus policy itself lives in `crate::optimizer::recurring`; the Python bindings
//! plug user policies (Python objects) in through the same traits.

use crate::optimizer::recurring::{BanditRng, JitPowerLimit, PolicyError, PruningGts};

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

impl From<PolicyError> for SimError {
    fn from(e: PolicyError) -> Self {
        SimError::InvalidArgument(e.to_string())
    }
}

impl<R: BanditRng> BatchSizePolicy for PruningGts<R> {
    fn predict(&mut self) -> SimResult<u32> {
        Ok(PruningGts::predict(self)?)
    }

    fn observe(&mut self, bs: u32, cost: f64, reached: bool) -> SimResult<()> {
        Ok(PruningGts::observe(self, bs, cost, Some(reached))?)
    }
}

impl PowerLimitPolicy for JitPowerLimit {
    fn predict(&mut self, bs: u32) -> SimResult<Option<u32>> {
        Ok(JitPowerLimit::predict(self, bs))
    }

    fn observe(&mut self, bs: u32, pl: u32, cost: f64) -> SimResult<()> {
        JitPowerLimit::observe(self, bs, pl, cost);
        Ok(())
    }
}
