//! `zeus._core` functions for `zeus.util`.

use pyo3::prelude::*;

/// `eta * energy + (1 - eta) * max_power * time`.
#[pyfunction]
fn zeus_cost(energy: f64, time: f64, eta_knob: f64, max_power: f64) -> f64 {
    crate::util::metric::zeus_cost(energy, time, eta_knob, max_power)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(zeus_cost, m)?)
}
