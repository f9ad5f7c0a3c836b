//! Optimizers: power limit (optimum selectors), Perseus (pipeline frequency plans), and the
//! batch size and power limit of recurring jobs (the Zeus policy and its trace simulator).

pub mod perseus;
pub mod power_limit;
pub mod recurring;
