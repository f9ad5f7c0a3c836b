//! `zeus._core` bindings of the recurring-job policy (`crate::optimizer::recurring`): the
//! numpy-compatible generator, pruning exploration, Thompson sampling and the stop rule. The
//! batch-size optimizer server, `zeus.policy` and `zeus.simulate` all decide through these.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::optimizer::recurring::{
    self as policy, Arm, Exploration, ExploreStep, PolicyError, StopRule,
};
use crate::util::numpy_rng::NumpyRng;

fn policy_err(e: PolicyError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// numpy's `default_rng` (PCG64 seeded through SeedSequence), draw for draw, with its state
/// in numpy's JSON form (`json.dumps(rng.bit_generator.state)`).
#[pyclass(name = "NumpyRng", module = "zeus._core")]
pub(crate) struct PyNumpyRng {
    inner: NumpyRng,
}

#[pymethods]
impl PyNumpyRng {
    /// `numpy.random.default_rng(seed)`; `None` seeds from the operating system.
    #[new]
    #[pyo3(signature = (seed = None))]
    fn new(seed: Option<u64>) -> Self {
        let seed = seed.unwrap_or_else(rand::random);
        PyNumpyRng {
            inner: NumpyRng::from_seed(seed),
        }
    }

    /// A generator in the state numpy's JSON describes.
    #[staticmethod]
    fn from_state(state: &str) -> PyResult<Self> {
        let inner =
            NumpyRng::from_state_json(state).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyNumpyRng { inner })
    }

    /// The state as numpy's JSON.
    #[getter]
    fn state(&self) -> String {
        self.inner.to_state_json()
    }

    /// `rng.choice(arange(n), n, replace=False)`.
    fn permutation(&mut self, n: usize) -> Vec<usize> {
        policy::BanditRng::permutation(&mut self.inner, n)
    }

    /// `rng.normal(loc, scale)`.
    fn normal(&mut self, loc: f64, scale: f64) -> f64 {
        policy::BanditRng::normal(&mut self.inner, loc, scale)
    }

    /// `rng.choice(n, 1, replace=False)[0]`: an integer in `0..n` (`n >= 1`).
    fn choice_one(&mut self, n: u64) -> PyResult<u64> {
        if n == 0 {
            return Err(PyValueError::new_err("choice_one needs n >= 1, got 0"));
        }
        Ok(self.inner.choice(n as usize, 1)[0] as u64)
    }
}

/// `(dispatched, converged, cost)` of one exploration.
type ExplorationTuple = (bool, bool, f64);

/// Pruning exploration's next step over the recorded explorations (per batch size, oldest
/// first): `("explore", bs)`, `("wait", None)`, `("done", survivors)` or, when a round left no
/// batch size, `("none_converged", message)`.
#[pyfunction]
fn pruning_next_step(
    py: Python<'_>,
    batch_sizes: Vec<u32>,
    default_batch_size: u32,
    num_pruning_rounds: usize,
    explorations: HashMap<u32, Vec<ExplorationTuple>>,
) -> PyResult<(&'static str, Py<PyAny>)> {
    let record: HashMap<u32, Vec<Exploration>> = explorations
        .into_iter()
        .map(|(bs, v)| {
            let v = v
                .into_iter()
                .map(|(dispatched, converged, cost)| Exploration {
                    dispatched,
                    converged,
                    cost,
                })
                .collect();
            (bs, v)
        })
        .collect();
    let step = policy::next_exploration(
        &batch_sizes,
        default_batch_size,
        num_pruning_rounds,
        &record,
    );
    Ok(match step {
        Ok(ExploreStep::Explore(bs)) => ("explore", bs.into_pyobject(py)?.into_any().unbind()),
        Ok(ExploreStep::Wait) => ("wait", py.None()),
        Ok(ExploreStep::Done(survivors)) => {
            ("done", survivors.into_pyobject(py)?.into_any().unbind())
        }
        Err(e @ PolicyError::NoConvergedBatchSize { .. }) => (
            "none_converged",
            e.to_string().into_pyobject(py)?.into_any().unbind(),
        ),
        Err(e) => return Err(policy_err(e)),
    })
}

/// `(batch_size, mean, precision, reward_precision, observations)` of one bandit arm.
type ArmTuple = (u32, f64, f64, f64, usize);

fn arm_of(t: ArmTuple) -> Arm {
    Arm {
        batch_size: t.0,
        mean: t.1,
        precision: t.2,
        reward_precision: t.3,
        observations: t.4,
    }
}

fn tuple_of(a: Arm) -> ArmTuple {
    (
        a.batch_size,
        a.mean,
        a.precision,
        a.reward_precision,
        a.observations,
    )
}

/// 1 / the population variance of `rewards`; infinite when they are all equal.
#[pyfunction]
fn reward_precision(rewards: Vec<f64>) -> f64 {
    policy::reward_precision(&rewards)
}

/// Conjugate update of an arm with `rewards` (from the prior when `reset`).
#[pyfunction]
fn bandit_fit_arm(
    arm: ArmTuple,
    rewards: Vec<f64>,
    reset: bool,
    prior_mean: f64,
    prior_precision: f64,
) -> ArmTuple {
    tuple_of(policy::fit_arm(
        arm_of(arm),
        &rewards,
        reset,
        prior_mean,
        prior_precision,
    ))
}

/// Thompson sampling's choice among `arms` (the generator advances as numpy's would).
#[pyfunction]
fn thompson_predict(
    arms: Vec<ArmTuple>,
    num_explorations: usize,
    rng: &mut PyNumpyRng,
) -> PyResult<u32> {
    let arms: Vec<Arm> = arms.into_iter().map(arm_of).collect();
    policy::thompson_predict(&arms, num_explorations, &mut rng.inner).map_err(policy_err)
}

/// The stop rule applied to one report: `(stop, converged, message)`.
#[pyfunction]
#[pyo3(signature = (*, batch_size, cost, metric, current_epoch, target_metric, higher_is_better,
                    max_epochs, beta_knob, min_cost))]
#[allow(clippy::too_many_arguments)]
fn decide_report(
    batch_size: u32,
    cost: f64,
    metric: f64,
    current_epoch: i64,
    target_metric: f64,
    higher_is_better: bool,
    max_epochs: i64,
    beta_knob: Option<f64>,
    min_cost: Option<f64>,
) -> (bool, bool, String) {
    let rule = StopRule {
        target_metric,
        higher_is_better,
        max_epochs,
        beta_knob,
    };
    let d = policy::decide_report(&rule, batch_size, cost, metric, current_epoch, min_cost);
    (d.stop, d.converged, d.message)
}

pub(crate) mod simulator;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    simulator::register(m)?;
    m.add_class::<PyNumpyRng>()?;
    m.add_function(wrap_pyfunction!(pruning_next_step, m)?)?;
    m.add_function(wrap_pyfunction!(reward_precision, m)?)?;
    m.add_function(wrap_pyfunction!(bandit_fit_arm, m)?)?;
    m.add_function(wrap_pyfunction!(thompson_predict, m)?)?;
    m.add_function(wrap_pyfunction!(decide_report, m)?)?;
    Ok(())
}
