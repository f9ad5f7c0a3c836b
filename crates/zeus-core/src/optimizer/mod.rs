//! Optimizers: power limit (optimum selectors) and Perseus (pipeline frequency plans).

pub mod perseus;
pub mod power_limit;
