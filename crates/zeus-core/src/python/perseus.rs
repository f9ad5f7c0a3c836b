//! `zeus._core` bindings for Perseus: the 1F1B pipeline DAG and the Phillips–Dessouky frontier.
//! Input errors become `ValueError` naming the bad value; the frontier is computed with the GIL
//! released.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::optimizer::perseus::{self, Dag, PerseusError};

fn value_error(e: PerseusError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The frontier computed by `compute_frontier`; points go from the slowest (cheapest)
/// iteration to the fastest.
#[pyclass(name = "PerseusFrontier", module = "zeus._core.perseus", frozen)]
pub(crate) struct PyFrontier {
    inner: perseus::Frontier,
}

impl PyFrontier {
    fn check(&self, k: usize) -> PyResult<()> {
        if k >= self.inner.len() {
            return Err(PyValueError::new_err(format!(
                "frontier point {k} out of range (0..{})",
                self.inner.len()
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl PyFrontier {
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    #[getter]
    fn unit_time(&self) -> f64 {
        self.inner.unit_time()
    }

    /// Iteration time of each point in units of `unit_time`, decreasing.
    #[getter]
    fn time_units(&self) -> Vec<u64> {
        self.inner.times().to_vec()
    }

    /// Iteration time of each point in seconds, decreasing.
    #[getter]
    fn times(&self) -> Vec<f64> {
        let u = self.inner.unit_time();
        self.inner.times().iter().map(|&t| t as f64 * u).collect()
    }

    /// Relaxed cost `C(T)` of each point, non-decreasing.
    #[getter]
    fn costs(&self) -> Vec<f64> {
        self.inner.costs().to_vec()
    }

    /// Planned duration of each node at point `k`, in units.
    fn durations(&self, k: usize) -> PyResult<Vec<u64>> {
        self.check(k)?;
        Ok(self.inner.durations(k).to_vec())
    }

    /// Index of the option each node runs at point `k`.
    fn choices(&self, k: usize) -> PyResult<Vec<usize>> {
        self.check(k)?;
        Ok(self.inner.choices(k))
    }

    /// Cheapest point whose iteration time is at most `limit_s` seconds, or `None`.
    fn best_within(&self, limit_s: f64) -> Option<usize> {
        let units = (limit_s / self.inner.unit_time() + 1e-6).floor();
        if units < 0.0 {
            return None;
        }
        self.inner.best_within(units as u64)
    }
}

/// A pipeline's frequency options (per node, `(seconds, joules)` at each option, fastest
/// first), its frontier, and the least-energy plan within a slowdown.
#[pyclass(name = "PerseusPipeline", module = "zeus._core.perseus", frozen)]
pub(crate) struct PyPipeline {
    inner: perseus::Pipeline,
}

#[pymethods]
impl PyPipeline {
    /// Node `v` runs on stage `stage_of[v]` with `options[v]`; a waiting GPU of stage `s` draws
    /// `blocking_power[s]` W. `unit_time` (s) quantises the frontier; default 1/500 of the
    /// all-max-frequency iteration time. The frontier is computed with the GIL released.
    #[new]
    #[pyo3(signature = (num_nodes, edges, stage_of, options, blocking_power, unit_time = None))]
    fn new(
        py: Python<'_>,
        num_nodes: usize,
        edges: Vec<(usize, usize)>,
        stage_of: Vec<usize>,
        options: Vec<Vec<(f64, f64)>>,
        blocking_power: Vec<f64>,
        unit_time: Option<f64>,
    ) -> PyResult<Self> {
        let dag = Dag { num_nodes, edges };
        let inner = py
            .detach(|| perseus::Pipeline::new(dag, stage_of, options, blocking_power, unit_time))
            .map_err(value_error)?;
        Ok(PyPipeline { inner })
    }

    /// The time–energy frontier (a copy).
    #[getter]
    fn frontier(&self) -> PyFrontier {
        PyFrontier {
            inner: self.inner.frontier().clone(),
        }
    }

    /// `(time s, energy J)` of running every instruction at its highest frequency.
    #[getter]
    fn all_max(&self) -> (f64, f64) {
        let c = self.inner.all_max();
        (c.time, c.energy)
    }

    /// `(time s, energy J)` of the plan `choices` (an option index per node).
    fn cost(&self, choices: Vec<usize>) -> PyResult<(f64, f64)> {
        let c = self.inner.cost(&choices).map_err(value_error)?;
        Ok((c.time, c.energy))
    }

    /// The option per node of the least-energy plan at most `slowdown` (a fraction) slower
    /// than all-max, on the profiled times.
    fn best_within(&self, py: Python<'_>, slowdown: f64) -> PyResult<Vec<usize>> {
        py.detach(|| self.inner.best_within(slowdown))
            .map_err(value_error)
    }
}

/// `(instructions, edges)` of one synchronous 1F1B iteration; each instruction is
/// `(stage, microbatch, "forward" | "backward")`, numbered stage by stage in execution order.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn pipeline_1f1b(
    num_stages: usize,
    num_microbatches: usize,
) -> PyResult<(Vec<(usize, usize, &'static str)>, Vec<(usize, usize)>)> {
    let (instr, dag) = perseus::pipeline_1f1b(num_stages, num_microbatches).map_err(value_error)?;
    Ok((
        instr
            .iter()
            .map(|i| (i.stage, i.microbatch, i.kind.name()))
            .collect(),
        dag.edges,
    ))
}

/// Longest path through the DAG when node `v` takes `durations[v]` seconds.
#[pyfunction]
fn makespan(num_nodes: usize, edges: Vec<(usize, usize)>, durations: Vec<f64>) -> PyResult<f64> {
    Dag { num_nodes, edges }
        .makespan(&durations)
        .map_err(value_error)
}

/// Time–cost frontier of a DAG whose node `v` chooses among `options[v]` = `[(time s, cost)]`,
/// with times quantised up to multiples of `unit_time` seconds.
#[pyfunction]
fn compute_frontier(
    py: Python<'_>,
    num_nodes: usize,
    edges: Vec<(usize, usize)>,
    options: Vec<Vec<(f64, f64)>>,
    unit_time: f64,
) -> PyResult<PyFrontier> {
    let dag = Dag { num_nodes, edges };
    let inner = py
        .detach(|| perseus::compute_frontier(&dag, &options, unit_time))
        .map_err(value_error)?;
    Ok(PyFrontier { inner })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFrontier>()?;
    m.add_class::<PyPipeline>()?;
    m.add_function(wrap_pyfunction!(pipeline_1f1b, m)?)?;
    m.add_function(wrap_pyfunction!(makespan, m)?)?;
    m.add_function(wrap_pyfunction!(compute_frontier, m)?)?;
    Ok(())
}
