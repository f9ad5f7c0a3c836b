//! The `zeus._core` extension module: a thin layer that converts types and errors and releases
//! the GIL around device calls. It mirrors the tree: one Python submodule per concern
//! (`zeus._core.device`, `.settings`, `.sim`, `.monitor`, `.power_limit`, `.recurring`,
//! `.perseus`, `.util`), each registered by its file here.

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
    add_submodule(m, "device", device::register)?;
    add_submodule(m, "settings", device::settings::register)?;
    add_submodule(m, "sim", sim::register)?;
    add_submodule(m, "util", util::register)?;
    add_submodule(m, "monitor", monitor::register)?;
    add_submodule(m, "power_limit", power_limit::register)?;
    add_submodule(m, "recurring", recurring::register)?;
    add_submodule(m, "perseus", perseus::register)?;
    Ok(())
}

/// Add `zeus._core.<name>`, filled by `register`. It is also put in `sys.modules`, so that
/// `import zeus._core.<name>` and `from zeus._core.<name> import X` find it (an extension
/// module's submodules are not found by the import system otherwise).
fn add_submodule(
    parent: &Bound<'_, PyModule>,
    name: &str,
    register: fn(&Bound<'_, PyModule>) -> PyResult<()>,
) -> PyResult<()> {
    let py = parent.py();
    let full = format!("zeus._core.{name}");
    let sub = PyModule::new(py, &full)?;
    register(&sub)?;
    parent.add(name, &sub)?;
    py.import("sys")?.getattr("modules")?.set_item(full, &sub)?;
    Ok(())
}
