//! Frequency plans of a pipeline: what a plan costs for real, and the least-energy plan within
//! a slowdown, repaired from the (quantised) frontier against the real times.
//!
//! A plan gives each instruction (DAG node) one of its frequency options, fastest first (option
//! 0 is the highest frequency). Its time is the DAG's makespan over the profiled durations; its
//! energy is the instructions' energy plus what each stage draws while it waits (blocking
//! power times the time it is not busy).

use super::dag::Dag;
use super::frontier::{compute_frontier, Frontier};
use super::PerseusError;

/// Frontier points tried from the first within the limit: the frontier is computed on
/// quantised times, so its cheapest point within the limit may need repairs that a slightly
/// faster point does not.
const CANDIDATES: usize = 16;

/// Predicted iteration time (s) and energy (J) of a plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanCost {
    pub time: f64,
    pub energy: f64,
}

/// A pipeline's profiled options, its frontier, and its plans.
#[derive(Debug, Clone)]
pub struct Pipeline {
    costs: Costs,
    frontier: Frontier,
    all_max: PlanCost,
}

/// What plans of a pipeline cost.
#[derive(Debug, Clone)]
struct Costs {
    dag: Dag,
    /// Stage of each node.
    stage_of: Vec<usize>,
    /// Per node, `(seconds, joules)` at each option, fastest first.
    options: Vec<Vec<(f64, f64)>>,
    /// Watts a waiting GPU of each stage draws.
    blocking_power: Vec<f64>,
    order: Vec<usize>,
}

impl Pipeline {
    /// The pipeline of `dag` whose node `v` runs on stage `stage_of[v]` with `options[v]`.
    ///
    /// `unit_time`: the frontier's time quantum; `None` is 1/500 of the all-max-frequency
    /// iteration time.
    ///
    /// # Errors
    /// [`PerseusError`] naming a bad edge, length, option or unit time.
    pub fn new(
        dag: Dag,
        stage_of: Vec<usize>,
        options: Vec<Vec<(f64, f64)>>,
        blocking_power: Vec<f64>,
        unit_time: Option<f64>,
    ) -> Result<Pipeline, PerseusError> {
        for (what, got) in [("stage_of", stage_of.len()), ("options", options.len())] {
            if got != dag.num_nodes {
                return Err(PerseusError::LengthMismatch {
                    what,
                    got,
                    expected: dag.num_nodes,
                });
            }
        }
        if let Some(activity) = options.iter().position(Vec::is_empty) {
            return Err(PerseusError::NoOptions { activity });
        }
        let stages = stage_of.iter().max().map_or(0, |&s| s + 1);
        if blocking_power.len() < stages {
            return Err(PerseusError::LengthMismatch {
                what: "blocking_power",
                got: blocking_power.len(),
                expected: stages,
            });
        }
        let order = dag.topological_order()?;
        let costs = Costs {
            dag,
            stage_of,
            options,
            blocking_power,
            order,
        };
        let all_max = costs.cost(&vec![0; costs.options.len()])?;
        let unit_time = unit_time.unwrap_or(all_max.time / 500.0);
        // The frontier ranks plans by their energy beyond blocking: waiting is charged to the
        // iteration time as a whole.
        let relaxed: Vec<Vec<(f64, f64)>> = costs
            .options
            .iter()
            .zip(&costs.stage_of)
            .map(|(opts, &s)| {
                let p = costs.blocking_power[s];
                opts.iter().map(|&(t, e)| (t, e - p * t)).collect()
            })
            .collect();
        let frontier = compute_frontier(&costs.dag, &relaxed, unit_time)?;
        Ok(Pipeline {
            costs,
            frontier,
            all_max,
        })
    }

    /// The frontier over the options (points from the slowest, cheapest plan to the fastest).
    pub fn frontier(&self) -> &Frontier {
        &self.frontier
    }

    /// The cost of running every instruction at its highest frequency.
    pub fn all_max(&self) -> PlanCost {
        self.all_max
    }

    /// What the plan `choices` (an option per node) costs.
    ///
    /// # Errors
    /// [`PerseusError::LengthMismatch`] for a wrong number of choices; a choice past a node's
    /// options is [`PerseusError::NoOptions`] of that node.
    pub fn cost(&self, choices: &[usize]) -> Result<PlanCost, PerseusError> {
        self.costs.cost(choices)
    }

    /// The least-energy plan at most `slowdown` (a fraction) slower than all-max, on the
    /// profiled times: each of the first few frontier points within the limit is repaired
    /// against the real times and the cheapest that meets the limit wins (all-max if none).
    ///
    /// # Errors
    /// [`PerseusError::BadSlowdown`] for a negative or NaN `slowdown`.
    pub fn best_within(&self, slowdown: f64) -> Result<Vec<usize>, PerseusError> {
        if slowdown.is_nan() || slowdown < 0.0 {
            return Err(PerseusError::BadSlowdown(slowdown));
        }
        let all_max = self.all_max;
        let limit = all_max.time * (1.0 + slowdown);
        let mut best = (vec![0; self.costs.options.len()], all_max.energy);
        // Frontier times are quantised up, so even its fastest point is slower than the real
        // all-max plan by up to a unit per instruction on the critical path: points are picked
        // against the quantised all-max time.
        let Some(&fastest) = self.frontier.times().last() else {
            return Ok(best.0);
        };
        let unit = self.frontier.unit_time();
        let limit_units = fastest + (slowdown * all_max.time / unit).floor() as u64;
        let Some(start) = self.frontier.best_within(limit_units) else {
            return Ok(best.0);
        };
        for k in start..(start + CANDIDATES).min(self.frontier.len()) {
            let choices = self.costs.repair(self.frontier.choices(k), limit)?;
            let plan = self.cost(&choices)?;
            if plan.time <= limit * (1.0 + 1e-12) && plan.energy < best.1 {
                best = (choices, plan.energy);
            }
        }
        Ok(best.0)
    }
}

impl Costs {
    fn durations(&self, choices: &[usize]) -> Vec<f64> {
        choices
            .iter()
            .enumerate()
            .map(|(v, &c)| self.options[v][c].0)
            .collect()
    }

    fn cost(&self, choices: &[usize]) -> Result<PlanCost, PerseusError> {
        self.check(choices)?;
        let time = self.dag.makespan(&self.durations(choices))?;
        let mut busy = vec![0.0; self.blocking_power.len()];
        let mut energy = 0.0;
        for (v, &c) in choices.iter().enumerate() {
            let (t, e) = self.options[v][c];
            busy[self.stage_of[v]] += t;
            energy += e;
        }
        let waiting: f64 = self
            .blocking_power
            .iter()
            .zip(&busy)
            .map(|(p, b)| p * (time - b))
            .sum();
        Ok(PlanCost {
            time,
            energy: energy + waiting,
        })
    }

    fn check(&self, choices: &[usize]) -> Result<(), PerseusError> {
        if choices.len() != self.options.len() {
            return Err(PerseusError::LengthMismatch {
                what: "choices",
                got: choices.len(),
                expected: self.options.len(),
            });
        }
        match choices
            .iter()
            .enumerate()
            .position(|(v, &c)| c >= self.options[v].len())
        {
            Some(activity) => Err(PerseusError::NoOptions { activity }),
            None => Ok(()),
        }
    }

    /// The nodes of the longest path when node `v` takes `durations[v]`, last node first (on
    /// ties the first predecessor and the lowest-numbered last node).
    fn critical_path(&self, durations: &[f64]) -> Vec<usize> {
        let n = durations.len();
        let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in &self.dag.edges {
            preds[b].push(a);
        }
        let mut finish = vec![0.0; n];
        let mut via: Vec<Option<usize>> = vec![None; n];
        for &v in &self.order {
            let mut start = 0.0;
            for &p in &preds[v] {
                if finish[p] > start {
                    start = finish[p];
                    via[v] = Some(p);
                }
            }
            finish[v] = start + durations[v];
        }
        let mut last = 0;
        for v in 1..n {
            if finish[v] > finish[last] {
                last = v;
            }
        }
        let mut path = Vec::new();
        let mut at = (n > 0).then_some(last);
        while let Some(v) = at {
            path.push(v);
            at = via[v];
        }
        path
    }

    /// Speed up instructions on the real critical path until the plan meets `limit`: each
    /// step moves the critical instruction with the least extra energy (beyond blocking) per
    /// second saved to its next faster option. All-max meets the limit, so this ends.
    fn repair(&self, mut choices: Vec<usize>, limit: f64) -> Result<Vec<usize>, PerseusError> {
        loop {
            let durations = self.durations(&choices);
            if self.dag.makespan(&durations)? <= limit {
                return Ok(choices);
            }
            let mut best: Option<(usize, f64)> = None;
            for v in self.critical_path(&durations) {
                let c = choices[v];
                if c == 0 {
                    continue;
                }
                let ((t0, e0), (t1, e1)) = (self.options[v][c - 1], self.options[v][c]);
                let p = self.blocking_power[self.stage_of[v]];
                let saved = t1 - t0;
                let extra = (e0 - p * t0) - (e1 - p * t1);
                let rate = if saved > 0.0 {
                    extra / saved
                } else {
                    f64::INFINITY
                };
                if best.is_none_or(|(_, r)| rate < r) && rate < f64::INFINITY {
                    best = Some((v, rate));
                }
            }
            match best {
                Some((v, _)) => choices[v] -= 1,
                None => return Ok(choices),
            }
        }
    }
}
