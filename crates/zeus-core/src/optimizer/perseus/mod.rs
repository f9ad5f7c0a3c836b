//! Perseus: energy-optimal GPU frequency plans for pipeline-parallel training.
//!
//! [`dag`] builds the DAG of one synchronous 1F1B iteration; [`frontier`] computes the
//! iteration time–energy frontier over per-instruction frequency choices with the
//! Phillips–Dessouky method; [`plan`] prices plans for real and picks the least-energy plan
//! within a slowdown, repairing frontier points against the unquantised times. The Python
//! server (`zeus.optimizer.perseus.server`) feeds it the instruction profiles.

pub mod dag;
pub mod frontier;
pub mod plan;

#[cfg(test)]
mod tests;

pub use dag::{pipeline_1f1b, stage_order_1f1b, Dag, Instruction, InstructionKind};
pub use frontier::{compute_frontier, Frontier};
pub use plan::{Pipeline, PlanCost};

/// Bad input to the Perseus core; each variant names the offending value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PerseusError {
    #[error("a pipeline needs at least one stage and one microbatch, got {num_stages} stages and {num_microbatches} microbatches")]
    EmptyPipeline {
        num_stages: usize,
        num_microbatches: usize,
    },
    #[error("edge {edge:?} refers to a node outside 0..{num_nodes}")]
    EdgeOutOfRange {
        edge: (usize, usize),
        num_nodes: usize,
    },
    #[error("the dependency graph has a cycle")]
    Cycle,
    #[error("{what} has {got} entries, expected one per node ({expected})")]
    LengthMismatch {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("activity {activity} has no (time, cost) options")]
    NoOptions { activity: usize },
    #[error("activity {activity} has an invalid option (time {time}, cost {cost}): time must be finite and >= 0, cost finite")]
    BadOption {
        activity: usize,
        time: f64,
        cost: f64,
    },
    #[error("slowdown must be >= 0, got {0}")]
    BadSlowdown(f64),
    #[error("unit_time must be a positive finite number of seconds, got {0}")]
    BadUnitTime(f64),
    #[error("activity {activity}: time {time} s is more than 1e9 units of {unit_time} s; use a larger unit_time")]
    TooManyUnits {
        activity: usize,
        time: f64,
        unit_time: f64,
    },
}
