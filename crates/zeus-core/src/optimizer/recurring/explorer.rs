//! Pruning exploration of the batch-size space, as a function of what was explored so far.

use std::collections::HashMap;

use super::PolicyError;

/// One exploration of a batch size that did not fail outright.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exploration {
    /// Still running (its outcome is not known yet).
    pub dispatched: bool,
    /// It reached the target within the cost bound (meaningless while dispatched).
    pub converged: bool,
    /// Its cost (meaningless while dispatched).
    pub cost: f64,
}

/// What pruning exploration does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExploreStep {
    /// Explore this batch size.
    Explore(u32),
    /// An exploration is running and the next step depends on it.
    Wait,
    /// Pruning is over; these batch sizes (ascending) survived.
    Done(Vec<u32>),
}

/// Replay pruning exploration over the recorded explorations and say what comes next.
///
/// Each round explores from the current default downwards (default first), stopping at the
/// first batch size that misses the target, then upwards from just above the default, also
/// stopping at the first miss. The batch sizes that reached the target are the next round's
/// candidates, and the cheapest of them (the first on ties) its default. The `r`-th exploration
/// of a batch size is `explorations[bs][r]`, so the position is recomputed from the record on
/// every call.
///
/// # Errors
/// [`PolicyError::NoConvergedBatchSize`] when a round ends with no survivor;
/// [`PolicyError::InvalidArgument`] when `default` is not among `batch_sizes`.
pub fn next_exploration(
    batch_sizes: &[u32],
    default: u32,
    rounds: usize,
    explorations: &HashMap<u32, Vec<Exploration>>,
) -> Result<ExploreStep, PolicyError> {
    let mut candidates = batch_sizes.to_vec();
    candidates.sort_unstable();
    candidates.dedup();
    let mut default = default;
    for round in 0..rounds {
        let idx = candidates
            .iter()
            .position(|&b| b == default)
            .ok_or_else(|| {
                PolicyError::InvalidArgument(format!(
                    "default batch size {default} is not among the batch sizes {candidates:?}"
                ))
            })?;
        let down = candidates[..=idx].iter().rev();
        let up = candidates[idx + 1..].iter();
        let mut survivors = Vec::new();
        let mut best = (f64::INFINITY, default);
        for direction in [down.copied().collect::<Vec<_>>(), up.copied().collect()] {
            for bs in direction {
                let Some(e) = explorations.get(&bs).and_then(|v| v.get(round)) else {
                    return Ok(ExploreStep::Explore(bs));
                };
                if e.dispatched {
                    return Ok(ExploreStep::Wait);
                }
                if !e.converged {
                    break;
                }
                survivors.push(bs);
                if e.cost < best.0 {
                    best = (e.cost, bs);
                }
            }
        }
        if survivors.is_empty() {
            return Err(PolicyError::NoConvergedBatchSize { round: round + 1 });
        }
        survivors.sort_unstable();
        candidates = survivors;
        default = best.1;
    }
    Ok(ExploreStep::Done(candidates))
}
