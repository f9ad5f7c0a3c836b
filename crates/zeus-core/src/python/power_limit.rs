//! `zeus._core` bindings for power_limit: the optimum selectors.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::optimizer::power_limit::{Measurement, Selector, SelectorError};

fn selector_err(e: SelectorError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A built-in optimum selector. `zeus.optimizer.power_limit` wraps it in the public classes.
#[pyclass(name = "PowerLimitSelector", module = "zeus._core.power_limit", frozen)]
pub(crate) struct PySelector {
    inner: Selector,
}

#[pymethods]
impl PySelector {
    #[staticmethod]
    fn energy() -> Self {
        PySelector {
            inner: Selector::Energy,
        }
    }

    #[staticmethod]
    fn time() -> Self {
        PySelector {
            inner: Selector::Time,
        }
    }

    /// `ValueError` unless `0 <= eta_knob <= 1` and `world_size >= 1`.
    #[staticmethod]
    fn zeus_cost(eta_knob: f64, world_size: i64) -> PyResult<Self> {
        let inner = Selector::zeus_cost(eta_knob, world_size).map_err(selector_err)?;
        Ok(PySelector { inner })
    }

    /// `ValueError` unless `factor >= 1`.
    #[staticmethod]
    fn max_slowdown(factor: f64) -> PyResult<Self> {
        let inner = Selector::max_slowdown(factor).map_err(selector_err)?;
        Ok(PySelector { inner })
    }

    /// Pick a power limit (W) from `(power_limit W, energy J, time s)` triples in profiling order.
    fn select(&self, measurements: Vec<(u32, f64, f64)>) -> PyResult<u32> {
        let ms: Vec<Measurement> = measurements
            .into_iter()
            .map(|(pl, e, t)| Measurement::new(pl, e, t))
            .collect();
        self.inner.select(&ms).map_err(selector_err)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySelector>()?;
    Ok(())
}
