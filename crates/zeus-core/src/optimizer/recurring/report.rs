//! The stop rule of a recurrence: when a report ends its run, and whether it converged.

/// The job's side of the rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopRule {
    pub target_metric: f64,
    pub higher_is_better: bool,
    pub max_epochs: i64,
    /// Early-stop threshold: a run stops once its cost exceeds `beta_knob * min_cost`.
    pub beta_knob: Option<f64>,
}

/// What a report means for its run.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportDecision {
    /// The run ends now.
    pub stop: bool,
    /// It ended having reached the target within the cost bound.
    pub converged: bool,
    /// Why, for people.
    pub message: String,
}

/// Apply the stop rule to a report of a run at `batch_size` whose cumulative cost is `cost`
/// and whose metric after `current_epoch` epochs is `metric`; `min_cost` is the cheapest
/// converged cost of the job so far. The early stop reacts to the cost so far, as the
/// reference server does.
pub fn decide_report(
    rule: &StopRule,
    batch_size: u32,
    cost: f64,
    metric: f64,
    current_epoch: i64,
    min_cost: Option<f64>,
) -> ReportDecision {
    let bound = match (rule.beta_knob, min_cost) {
        (Some(beta), Some(min)) => beta * min,
        _ => f64::INFINITY,
    };
    let within = cost <= bound;
    let reached = if rule.higher_is_better {
        rule.target_metric <= metric
    } else {
        rule.target_metric >= metric
    };
    if within && current_epoch < rule.max_epochs && !reached {
        return ReportDecision {
            stop: false,
            converged: false,
            message: "Stop condition not met, keep training".into(),
        };
    }
    let message = if !within {
        format!(
            "Batch Size({batch_size}) exceeded the cost upper bound: current cost({cost}) > \
             beta_knob({})*min_cost({})",
            rule.beta_knob.unwrap_or(f64::NAN),
            min_cost.unwrap_or(f64::NAN)
        )
    } else if reached {
        "Train succeeded".into()
    } else {
        format!(
            "Train failed to converge within max_epoch({})",
            rule.max_epochs
        )
    };
    ReportDecision {
        stop: true,
        converged: reached && within,
        message,
    }
}
