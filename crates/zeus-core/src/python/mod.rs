//! The `zeus._core` extension module: a thin layer that converts types and errors and releases
//! the GIL around device calls. Every submodule registers its own classes and functions.

use pyo3::prelude::*;

pub(crate) mod device;
pub(crate) mod errors;
pub(crate) mod monitor;
pub(crate) mod perseus;
pub(crate) mod power_limit;
pub(crate) mod recurring;
pub(crate) mod sim;
pub(crate) mod util;

#[pymodule]
#[pyo3(name = "_core")]
fn zeus_core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    device::register(m)?;
    sim::register(m)?;
    util::register(m)?;
    monitor::register(m)?;
    power_limit::register(m)?;
    recurring::register(m)?;
    perseus::register(m)?;
    Ok(())
}
