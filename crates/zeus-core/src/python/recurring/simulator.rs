//! `zeus._core.SimTable`: one job's trace tables and the simulator's recurrence loop.
//!
//! The built-in Zeus policy and the baseline run entirely in Rust with the GIL released; user
//! policies written in Python are called back once per decision (the slower path).

use std::path::Path;

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::optimizer::recurring::simulator::policy::{BatchSizePolicy, PowerLimitPolicy};
use crate::optimizer::recurring::simulator::trace::{self, SimError};
use crate::optimizer::recurring::simulator::{self as sim, HistoryEntry, JobSpec, JobTable, Knobs};

fn to_py(e: SimError) -> PyErr {
    match &e {
        SimError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(e.to_string())
        }
        SimError::Io { .. } => PyOSError::new_err(e.to_string()),
        SimError::NotConverged(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// (rec, try, batch_size, power_limit, energy, time, reached)
type Row = (u32, u32, u32, u32, f64, f64, bool);

fn rows(h: Vec<HistoryEntry>) -> Vec<Row> {
    h.into_iter()
        .map(|e| {
            (
                e.rec,
                e.attempt,
                e.batch_size,
                e.power_limit,
                e.energy,
                e.time,
                e.reached,
            )
        })
        .collect()
}

#[pyclass(name = "SimTable", module = "zeus._core.recurring", frozen)]
pub(crate) struct PySimTable {
    inner: JobTable,
}

/// Either a path or in-memory CSV text.
fn load<T: Send + Sync>(
    py: Python<'_>,
    path: Option<String>,
    text: Option<String>,
    name: &str,
    from_path: fn(&Path) -> sim::SimResult<std::sync::Arc<Vec<T>>>,
    from_text: fn(&str, &str) -> sim::SimResult<Vec<T>>,
) -> PyResult<std::sync::Arc<Vec<T>>> {
    match (path, text) {
        (Some(p), None) => py.detach(|| from_path(Path::new(&p))).map_err(to_py),
        (None, Some(t)) => from_text(name, &t).map(std::sync::Arc::new).map_err(to_py),
        _ => Err(PyValueError::new_err(format!(
            "give exactly one of a path or CSV text for {name}"
        ))),
    }
}

/// A Python policy object the simulator calls back. A Python exception
/// stops the simulation; it is kept here and re-raised as is once the Rust loop has returned.
struct PyCallback<'py> {
    obj: Bound<'py, PyAny>,
    /// The `Job` passed to policy methods.
    job: Bound<'py, PyAny>,
    /// What the object is, for the Rust-side error that unwinds the loop.
    what: &'static str,
    err: Option<PyErr>,
}

impl<'py> PyCallback<'py> {
    fn new(obj: Bound<'py, PyAny>, job: Bound<'py, PyAny>, what: &'static str) -> Self {
        PyCallback {
            obj,
            job,
            what,
            err: None,
        }
    }

    fn job(&self) -> &Bound<'py, PyAny> {
        &self.job
    }

    /// Keep a Python error, if any, and turn it into the simulator's error.
    fn check<T>(&mut self, r: PyResult<T>) -> sim::SimResult<T> {
        r.map_err(|e| {
            self.err = Some(e);
            SimError::InvalidArgument(format!("the Python {} raised", self.what))
        })
    }
}

impl BatchSizePolicy for PyCallback<'_> {
    fn predict(&mut self) -> sim::SimResult<u32> {
        let r = self
            .obj
            .call_method1("predict", (self.job(),))
            .and_then(|v| v.extract::<u32>());
        self.check(r)
    }

    fn observe(&mut self, bs: u32, cost: f64, reached: bool) -> sim::SimResult<()> {
        let r = self
            .obj
            .call_method1("observe", (self.job(), bs, cost, reached));
        self.check(r).map(|_| ())
    }
}

impl PowerLimitPolicy for PyCallback<'_> {
    fn predict(&mut self, bs: u32) -> sim::SimResult<Option<u32>> {
        let r = self
            .obj
            .call_method1("predict", (self.job(), bs))
            .and_then(|v| v.extract::<Option<u32>>());
        self.check(r)
    }

    fn observe(&mut self, bs: u32, pl: u32, cost: f64) -> sim::SimResult<()> {
        let r = self.obj.call_method1("observe", (self.job(), bs, pl, cost));
        self.check(r).map(|_| ())
    }
}

#[pymethods]
impl PySimTable {
    /// Build the table of one job from a train and a power trace (paths or CSV text).
    ///
    /// `default_bs=None` means the largest batch size (only the pruning policy needs it).
    #[new]
    #[pyo3(signature = (dataset, network, optimizer, target_metric, max_epochs, default_bs=None,
                        *, train_path=None, power_path=None, train_text=None, power_text=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dataset: String,
        network: String,
        optimizer: String,
        target_metric: f64,
        max_epochs: u32,
        default_bs: Option<u32>,
        train_path: Option<String>,
        power_path: Option<String>,
        train_text: Option<String>,
        power_text: Option<String>,
    ) -> PyResult<Self> {
        if max_epochs == 0 {
            return Err(PyValueError::new_err("max_epochs must be positive, got 0"));
        }
        let train = load(
            py,
            train_path,
            train_text,
            "summary_train",
            sim::read_train_cached,
            trace::parse_train,
        )?;
        let power = load(
            py,
            power_path,
            power_text,
            "summary_power",
            sim::read_power_cached,
            trace::parse_power,
        )?;
        let job = JobSpec {
            dataset,
            network,
            optimizer,
            target_metric,
            max_epochs,
            default_bs: default_bs.unwrap_or(u32::MAX),
        };
        let inner = JobTable::build(&job, &train, &power).map_err(to_py)?;
        Ok(PySimTable { inner })
    }

    /// The table of a built-in workload on `gpu`, read from `trace_dir`.
    #[staticmethod]
    fn builtin(py: Python<'_>, trace_dir: String, gpu: String, workload: String) -> PyResult<Self> {
        let inner = py
            .detach(|| sim::load_builtin(Path::new(&trace_dir), &gpu, &workload))
            .map_err(to_py)?;
        Ok(PySimTable { inner })
    }

    /// Names of the built-in workloads with (network, optimizer, target, max epochs, b0).
    #[staticmethod]
    fn builtin_workloads() -> Vec<(&'static str, &'static str, &'static str, f64, u32, u32)> {
        sim::BUILTIN_WORKLOADS.to_vec()
    }

    #[getter]
    fn batch_sizes(&self) -> Vec<u32> {
        self.inner.batch_size_list()
    }

    /// Power limits (W, ascending) of one batch size.
    fn power_limits(&self, batch_size: u32) -> PyResult<Vec<u32>> {
        let i = self.inner.index_of(batch_size).map_err(to_py)?;
        Ok(self.inner.batch_sizes[i]
            .epochs
            .iter()
            .map(|e| e.power_limit)
            .collect())
    }

    /// Number of distinct power limits.
    #[getter]
    fn num_power_limits(&self) -> usize {
        self.inner.num_power_limits()
    }

    /// `MAXPOWER` of the merged trace, W.
    #[getter]
    fn max_power(&self) -> f64 {
        self.inner.max_power
    }

    /// Default batch size after clamping to the trace.
    #[getter]
    fn default_bs(&self) -> u32 {
        self.inner.job.default_bs
    }

    /// `(dataset, network, optimizer, target_metric, max_epochs)`.
    #[getter]
    fn job(&self) -> (String, String, String, f64, u32) {
        let j = &self.inner.job;
        (
            j.dataset.clone(),
            j.network.clone(),
            j.optimizer.clone(),
            j.target_metric,
            j.max_epochs,
        )
    }

    /// Training paths (target epoch or None) of one batch size.
    fn paths(&self, batch_size: u32) -> PyResult<Vec<Option<f64>>> {
        let i = self.inner.index_of(batch_size).map_err(to_py)?;
        Ok(self.inner.batch_sizes[i].paths.clone())
    }

    /// `{pl: epoch_cost}` high to low power limit (paper Eq. 7).
    fn profile_power_limits(&self, batch_size: u32, eta: f64) -> PyResult<Vec<(u32, f64)>> {
        let i = self.inner.index_of(batch_size).map_err(to_py)?;
        Ok(self.inner.profile_power_limits(i, eta))
    }

    /// Default number of recurrences: 2·|batch sizes|·|power limits|.
    #[getter]
    fn default_recurrences(&self) -> u32 {
        sim::default_recurrences(&self.inner)
    }

    /// Run the built-in Zeus policy; returns history rows.
    ///
    /// `seed` drives the path sampler; the bandit uses `bandit_seed` (default: `seed`), as the
    /// reference seeds its simulator and its batch-size optimizer separately.
    #[pyo3(signature = (seed, eta, beta, recurrences, prior_mean=0.0, prior_precision=0.0,
                        window_size=0, bandit_seed=None))]
    #[allow(clippy::too_many_arguments)]
    fn simulate_zeus(
        &self,
        py: Python<'_>,
        seed: u64,
        eta: f64,
        beta: f64,
        recurrences: u32,
        prior_mean: f64,
        prior_precision: f64,
        window_size: usize,
        bandit_seed: Option<u64>,
    ) -> PyResult<Vec<Row>> {
        let knobs = Knobs {
            eta,
            beta,
            recurrences,
            seed,
        };
        let t = &self.inner;
        py.detach(|| {
            t.simulate_zeus_with(
                knobs,
                prior_mean,
                prior_precision,
                window_size,
                bandit_seed.unwrap_or(seed),
            )
        })
        .map(rows)
        .map_err(to_py)
    }

    /// Run the deterministic baseline; returns history rows.
    fn simulate_default(
        &self,
        py: Python<'_>,
        seed: u64,
        eta: f64,
        recurrences: u32,
    ) -> PyResult<Vec<Row>> {
        let knobs = Knobs {
            eta,
            beta: f64::INFINITY,
            recurrences,
            seed,
        };
        py.detach(|| self.inner.simulate_default(knobs))
            .map(rows)
            .map_err(to_py)
    }

    /// Run the loop with Python policy objects (`predict(job)`, `observe(job, bs, cost,
    /// reached)`; `predict(job, bs)`, `observe(job, bs, pl, cost)`).
    #[allow(clippy::too_many_arguments)]
    fn simulate_with(
        &self,
        job: Bound<'_, PyAny>,
        batch_size_optimizer: Bound<'_, PyAny>,
        power_limit_optimizer: Bound<'_, PyAny>,
        seed: u64,
        eta: f64,
        beta: f64,
        recurrences: u32,
    ) -> PyResult<Vec<Row>> {
        let knobs = Knobs {
            eta,
            beta,
            recurrences,
            seed,
        };
        let mut bso = PyCallback::new(batch_size_optimizer, job.clone(), "batch size optimizer");
        let mut plo = PyCallback::new(power_limit_optimizer, job, "power limit optimizer");
        match self.inner.simulate(&mut bso, &mut plo, knobs) {
            Ok(h) => Ok(rows(h)),
            Err(e) => match bso.err.take().or(plo.err.take()) {
                Some(err) => Err(err),
                None => Err(to_py(e)),
            },
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySimTable>()?;
    Ok(())
}
