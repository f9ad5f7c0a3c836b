//! Just-in-time power-limit optimization: the cheapest profiled power limit of each batch size.

use std::collections::HashMap;

/// The best power limit seen per batch size; on equal cost the first observed (profiling goes
/// from the highest limit down, so the higher one) is kept.
#[derive(Debug, Clone, Default)]
pub struct JitPowerLimit {
    best: HashMap<u32, (u32, f64)>,
}

impl JitPowerLimit {
    /// The power limit to use for `batch_size`, or `None` while it still needs profiling.
    pub fn predict(&self, batch_size: u32) -> Option<u32> {
        self.best.get(&batch_size).map(|b| b.0)
    }

    /// `(batch_size, (power_limit, cost))` of the best limit of each profiled batch size.
    pub fn best(&self) -> impl Iterator<Item = (u32, (u32, f64))> + '_ {
        self.best.iter().map(|(&bs, &b)| (bs, b))
    }

    /// Learn the cost of `batch_size` at `power_limit`.
    pub fn observe(&mut self, batch_size: u32, power_limit: u32, cost: f64) {
        match self.best.get(&batch_size) {
            Some(&(_, c)) if c <= cost => {}
            _ => {
                self.best.insert(batch_size, (power_limit, cost));
            }
        }
    }
}
