//! `zeus._core` bindings of the recurring-job policy (`crate::optimizer::recurring`): the
//! numpy-compatible generator, the batch-size policy's one composition (`PruningGtsPolicy`,
//! stateless, for the server; `PruningGts`, one job in memory, for `zeus.policy`), the
//! just-in-time power limit, and the primitives beneath them (pruning, Thompson sampling, the
//! stop rule). The batch-size optimizer server, `zeus.policy` and `zeus.simulate` all decide
//! through these.

use std::collections::HashMap;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::optimizer::recurring::{
    self as policy, Arm, Decision, Exploration, ExploreStep, JitPowerLimit, PolicyError,
    PruningGts, PruningGtsPolicy, StopRule, TrialKind,
};
use crate::util::numpy_rng::{NumpyRng, Pcg64State};

pyo3::create_exception!(
    zeus._core.recurring,
    NoConvergedBatchSizeError,
    PyValueError,
    "A pruning round ended without any batch size that reached the target."
);

fn policy_err(e: PolicyError) -> PyErr {
    match e {
        PolicyError::NoConvergedBatchSize { .. } => {
            NoConvergedBatchSizeError::new_err(e.to_string())
        }
        PolicyError::NotExpected { .. } => PyRuntimeError::new_err(e.to_string()),
        PolicyError::InvalidArgument(_) => PyValueError::new_err(e.to_string()),
    }
}

/// numpy's `default_rng` (PCG64 seeded through SeedSequence), draw for draw, with its state
/// as numpy's `rng.bit_generator.state` dict (whose `json.dumps` is what the server stores).
#[pyclass(name = "NumpyRng", module = "zeus._core.recurring")]
pub(crate) struct PyNumpyRng {
    inner: NumpyRng,
}

/// The member `key` of a state dict, named `field` in errors.
fn state_member<'py>(
    dict: &Bound<'py, PyAny>,
    key: &str,
    field: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let dict = dict.cast::<PyDict>().map_err(|_| {
        PyValueError::new_err(format!(
            "generator state field `{field}`'s parent is not a dict"
        ))
    })?;
    dict.get_item(key)?
        .ok_or_else(|| PyValueError::new_err(format!("generator state lacks the field `{field}`")))
}

/// An integer member of a state dict in `0..=max`.
fn state_uint(dict: &Bound<'_, PyAny>, key: &str, field: &str, max: u128) -> PyResult<u128> {
    let value = state_member(dict, key, field)?;
    let n: Option<u128> = value.extract().ok();
    n.filter(|&n| n <= max).ok_or_else(|| {
        PyValueError::new_err(format!(
            "generator state field `{field}` is invalid: expected an integer in 0..={max}, \
             found {value}"
        ))
    })
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

    /// The generator in the state numpy's `bit_generator.state` dict describes; as numpy's
    /// setter, `bit_generator` must be `"PCG64"` and other keys are ignored. Errors name the
    /// field (`state.inc`, ...).
    #[staticmethod]
    fn from_state(state: &Bound<'_, PyAny>) -> PyResult<Self> {
        let name = state_member(state, "bit_generator", "bit_generator")?;
        if name.extract::<String>().ok().as_deref() != Some("PCG64") {
            return Err(PyValueError::new_err(format!(
                "generator state field `bit_generator` is invalid: expected \"PCG64\", found \
                 {name}"
            )));
        }
        let lcg = state_member(state, "state", "state")?;
        let pcg = Pcg64State {
            state: state_uint(&lcg, "state", "state.state", u128::MAX)?,
            inc: state_uint(&lcg, "inc", "state.inc", u128::MAX)?,
            has_uint32: state_uint(state, "has_uint32", "has_uint32", 1)? == 1,
            // Lossless: bounded by u32::MAX.
            uinteger: state_uint(state, "uinteger", "uinteger", u32::MAX.into())? as u32,
        };
        Ok(PyNumpyRng {
            inner: NumpyRng::from_state(pcg),
        })
    }

    /// numpy's `rng.bit_generator.state`: `{"bit_generator": "PCG64", "state": {"state": ...,
    /// "inc": ...}, "has_uint32": 0 or 1, "uinteger": ...}`.
    #[getter]
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.state();
        let lcg = PyDict::new(py);
        lcg.set_item("state", s.state)?;
        lcg.set_item("inc", s.inc)?;
        let out = PyDict::new(py);
        out.set_item("bit_generator", "PCG64")?;
        out.set_item("state", lcg)?;
        out.set_item("has_uint32", u8::from(s.has_uint32))?;
        out.set_item("uinteger", s.uinteger)?;
        Ok(out)
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

/// One bandit arm (a batch size) and the belief about its mean reward (minus cost); the names
/// are the reference server's columns.
#[pyclass(
    name = "Arm",
    module = "zeus._core.recurring",
    frozen,
    eq,
    skip_from_py_object
)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyArm {
    inner: Arm,
}

#[pymethods]
impl PyArm {
    #[new]
    fn new(
        batch_size: u32,
        param_mean: f64,
        param_precision: f64,
        reward_precision: f64,
        num_observations: usize,
    ) -> Self {
        PyArm {
            inner: Arm {
                batch_size,
                mean: param_mean,
                precision: param_precision,
                reward_precision,
                observations: num_observations,
            },
        }
    }

    #[getter]
    fn batch_size(&self) -> u32 {
        self.inner.batch_size
    }

    /// Posterior mean of the arm's expected reward.
    #[getter]
    fn param_mean(&self) -> f64 {
        self.inner.mean
    }

    /// Posterior precision of that mean (infinite once it is known exactly).
    #[getter]
    fn param_precision(&self) -> f64 {
        self.inner.precision
    }

    /// Precision of one reward.
    #[getter]
    fn reward_precision(&self) -> f64 {
        self.inner.reward_precision
    }

    /// Rewards the posterior is fitted on.
    #[getter]
    fn num_observations(&self) -> usize {
        self.inner.observations
    }

    fn __repr__(&self) -> String {
        let a = &self.inner;
        format!(
            "Arm(batch_size={}, param_mean={}, param_precision={}, reward_precision={}, \
             num_observations={})",
            a.batch_size, a.mean, a.precision, a.reward_precision, a.observations
        )
    }
}

fn py_arms(arms: &[Arm]) -> Vec<PyArm> {
    arms.iter().map(|&inner| PyArm { inner }).collect()
}

fn core_arms(arms: &[PyRef<'_, PyArm>]) -> Vec<Arm> {
    arms.iter().map(|a| a.inner).collect()
}

/// 1 / the population variance of `rewards`; infinite when they are all equal.
#[pyfunction]
fn reward_precision(rewards: Vec<f64>) -> f64 {
    policy::reward_precision(&rewards)
}

/// Conjugate update of an arm with `rewards` (from the prior when `reset`).
#[pyfunction]
fn bandit_fit_arm(
    arm: PyRef<'_, PyArm>,
    rewards: Vec<f64>,
    reset: bool,
    prior_mean: f64,
    prior_precision: f64,
) -> PyArm {
    PyArm {
        inner: policy::fit_arm(arm.inner, &rewards, reset, prior_mean, prior_precision),
    }
}

/// Thompson sampling's choice among `arms` (the generator advances as numpy's would).
#[pyfunction]
fn thompson_predict(
    arms: Vec<PyRef<'_, PyArm>>,
    num_explorations: usize,
    rng: &mut PyNumpyRng,
) -> PyResult<u32> {
    policy::thompson_predict(&core_arms(&arms), num_explorations, &mut rng.inner)
        .map_err(policy_err)
}

fn explorations_of(record: HashMap<u32, Vec<ExplorationTuple>>) -> HashMap<u32, Vec<Exploration>> {
    record
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
        .collect()
}

/// The next trial of a job, as `PruningGtsPolicy.decide` returns it.
#[pyclass(name = "Decision", module = "zeus._core.recurring", frozen, get_all)]
pub(crate) struct PyDecision {
    /// The batch size the trial runs.
    batch_size: u32,
    /// `"exploration"`, `"concurrent"` (an exploration is in flight: the best batch size so
    /// far) or `"bandit"`.
    kind: &'static str,
    /// The bandit's arms when this decision ended pruning, else None.
    new_arms: Option<Vec<PyArm>>,
}

impl From<Decision> for PyDecision {
    fn from(d: Decision) -> Self {
        PyDecision {
            batch_size: d.batch_size,
            kind: match d.kind {
                TrialKind::Exploration => "exploration",
                TrialKind::Concurrent => "concurrent",
                TrialKind::Bandit => "bandit",
            },
            new_arms: d.new_arms.as_deref().map(py_arms),
        }
    }
}

/// A job's settings of the Zeus batch-size policy (pruning exploration, then Gaussian
/// Thompson sampling), and its rules over the job's record.
#[pyclass(name = "PruningGtsPolicy", module = "zeus._core.recurring", frozen)]
pub(crate) struct PyPruningGtsPolicy {
    inner: PruningGtsPolicy,
}

#[pymethods]
impl PyPruningGtsPolicy {
    /// `window_size` of 0 or less fits each arm on all its rewards.
    #[new]
    #[pyo3(signature = (batch_sizes, default_batch_size, pruning_rounds = 2, prior_mean = 0.0,
                        prior_precision = 0.0, bandit_explorations = 2, window_size = 0))]
    fn new(
        batch_sizes: Vec<u32>,
        default_batch_size: u32,
        pruning_rounds: usize,
        prior_mean: f64,
        prior_precision: f64,
        bandit_explorations: usize,
        window_size: i64,
    ) -> PyResult<Self> {
        let inner = PruningGtsPolicy::new(
            &batch_sizes,
            default_batch_size,
            pruning_rounds,
            prior_mean,
            prior_precision,
            bandit_explorations,
            usize::try_from(window_size).unwrap_or(0),
        )
        .map_err(policy_err)?;
        Ok(PyPruningGtsPolicy { inner })
    }

    /// The candidate batch sizes, ascending.
    #[getter]
    fn batch_sizes(&self) -> Vec<u32> {
        self.inner.batch_sizes().to_vec()
    }

    /// The batch size pruning starts from.
    #[getter]
    fn default_batch_size(&self) -> u32 {
        self.inner.default_batch_size()
    }

    /// The arm of `batch_size` fitted from the prior on the window of `rewards` (oldest first).
    fn fit(&self, batch_size: u32, rewards: Vec<f64>) -> PyArm {
        PyArm {
            inner: self.inner.fit(batch_size, &rewards),
        }
    }

    /// Pruning's next step over the recorded explorations (`(dispatched, converged, cost)` per
    /// batch size, oldest first): `("explore", bs)`, `("wait", None)` or `("done", survivors)`.
    /// Raises `NoConvergedBatchSizeError` when a round left no batch size.
    fn next_exploration(
        &self,
        py: Python<'_>,
        explorations: HashMap<u32, Vec<ExplorationTuple>>,
    ) -> PyResult<(&'static str, Py<PyAny>)> {
        Ok(
            match self.inner.next_exploration(&explorations_of(explorations)) {
                Ok(ExploreStep::Explore(bs)) => {
                    ("explore", bs.into_pyobject(py)?.into_any().unbind())
                }
                Ok(ExploreStep::Wait) => ("wait", py.None()),
                Ok(ExploreStep::Done(survivors)) => {
                    ("done", survivors.into_pyobject(py)?.into_any().unbind())
                }
                Err(e) => return Err(policy_err(e)),
            },
        )
    }

    /// The next trial of a job: `arms` once pruning is over (else None), `explorations`
    /// (`(dispatched, converged, cost)` per batch size, oldest first), `rewards` (minus the
    /// cost of every finished trial per batch size, oldest first), the batch size to run while
    /// an exploration is in flight, and the job's generator (advanced only by the bandit).
    fn decide(
        &self,
        arms: Option<Vec<PyRef<'_, PyArm>>>,
        explorations: HashMap<u32, Vec<ExplorationTuple>>,
        rewards: HashMap<u32, Vec<f64>>,
        best_so_far: u32,
        rng: &mut PyNumpyRng,
    ) -> PyResult<PyDecision> {
        let arms = arms.map(|a| core_arms(&a));
        self.inner
            .decide(
                arms.as_deref(),
                &explorations_of(explorations),
                &rewards,
                best_so_far,
                &mut rng.inner,
            )
            .map(PyDecision::from)
            .map_err(policy_err)
    }
}

/// One job's batch-size optimizer kept in memory, deciding by a `PruningGtsPolicy`.
#[pyclass(name = "PruningGts", module = "zeus._core.recurring")]
pub(crate) struct PyPruningGts {
    inner: PruningGts<NumpyRng>,
}

#[pymethods]
impl PyPruningGts {
    /// `concurrency`: observations of a batch size other than the one being explored are
    /// ignored by pruning instead of refused. `seed` seeds the bandit's generator.
    #[new]
    fn new(policy: PyRef<'_, PyPruningGtsPolicy>, concurrency: bool, seed: u64) -> Self {
        PyPruningGts {
            inner: PruningGts::new(policy.inner.clone(), concurrency, NumpyRng::from_seed(seed)),
        }
    }

    /// The batch size of the next recurrence.
    fn predict(&mut self) -> PyResult<u32> {
        self.inner.predict().map_err(policy_err)
    }

    /// Learn the cost of a recurrence; `converged` is needed while pruning lasts.
    #[pyo3(signature = (batch_size, cost, converged = None))]
    fn observe(&mut self, batch_size: u32, cost: f64, converged: Option<bool>) -> PyResult<()> {
        self.inner
            .observe(batch_size, cost, converged)
            .map_err(policy_err)
    }

    /// The candidate batch sizes, ascending.
    #[getter]
    fn batch_sizes(&self) -> Vec<u32> {
        self.inner.policy().batch_sizes().to_vec()
    }

    /// The batch size pruning starts from.
    #[getter]
    fn default_batch_size(&self) -> u32 {
        self.inner.policy().default_batch_size()
    }

    /// Whether pruning is over and the bandit decides.
    #[getter]
    fn in_bandit_stage(&self) -> bool {
        self.inner.in_bandit_stage()
    }

    /// The bandit's arms (None while pruning lasts).
    #[getter]
    fn arms(&self) -> Option<Vec<PyArm>> {
        self.inner.arms().map(py_arms)
    }

    /// The batch size pruning explores next (None once it is over).
    #[getter]
    fn expecting(&self) -> Option<u32> {
        self.inner.expecting()
    }

    /// Pruning's explorations, `(dispatched, converged, cost)` per batch size, oldest first.
    #[getter]
    fn explorations<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (bs, v) in self.inner.explorations() {
            let v: Vec<ExplorationTuple> = v
                .iter()
                .map(|e| (e.dispatched, e.converged, e.cost))
                .collect();
            out.set_item(bs, v)?;
        }
        Ok(out)
    }

    /// A copy of the bandit's generator, in its current state.
    #[getter]
    fn rng(&self) -> PyNumpyRng {
        PyNumpyRng {
            inner: self.inner.rng().clone(),
        }
    }

    fn __copy__(&self) -> Self {
        PyPruningGts {
            inner: self.inner.clone(),
        }
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> Self {
        self.__copy__()
    }
}

/// Just-in-time power-limit optimization: the cheapest profiled power limit per batch size
/// (on equal cost, the first observed).
#[pyclass(name = "JitPowerLimit", module = "zeus._core.recurring")]
#[derive(Default)]
pub(crate) struct PyJitPowerLimit {
    inner: JitPowerLimit,
}

#[pymethods]
impl PyJitPowerLimit {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// The power limit for `batch_size`, or None while it still needs profiling.
    fn predict(&self, batch_size: u32) -> Option<u32> {
        self.inner.predict(batch_size)
    }

    /// Learn the cost of `batch_size` at `power_limit`.
    fn observe(&mut self, batch_size: u32, power_limit: u32, cost: f64) {
        self.inner.observe(batch_size, power_limit, cost);
    }

    /// `{batch_size: (power_limit, cost)}` of the best limit of each profiled batch size.
    #[getter]
    fn best(&self) -> HashMap<u32, (u32, f64)> {
        self.inner.best().collect()
    }

    fn __copy__(&self) -> Self {
        PyJitPowerLimit {
            inner: self.inner.clone(),
        }
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> Self {
        self.__copy__()
    }
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
    m.add_class::<PyArm>()?;
    m.add_class::<PyDecision>()?;
    m.add_class::<PyPruningGtsPolicy>()?;
    m.add_class::<PyPruningGts>()?;
    m.add_class::<PyJitPowerLimit>()?;
    m.add(
        "NoConvergedBatchSizeError",
        m.py().get_type::<NoConvergedBatchSizeError>(),
    )?;
    m.add_function(wrap_pyfunction!(reward_precision, m)?)?;
    m.add_function(wrap_pyfunction!(bandit_fit_arm, m)?)?;
    m.add_function(wrap_pyfunction!(thompson_predict, m)?)?;
    m.add_function(wrap_pyfunction!(decide_report, m)?)?;
    Ok(())
}
