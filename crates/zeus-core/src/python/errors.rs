//! Rust errors to Python exceptions. The exception classes are defined in Python
//! (`zeus.device.exception`) so that they keep the reference's names, hierarchy and `.message`
//! attribute; here we only look them up and instantiate them.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

use crate::device::cpu::CpuError;
use crate::device::GpuError;

static GPU_EXCEPTIONS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
static CPU_EXCEPTIONS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Build the Python exception for a GPU error.
pub(crate) fn gpu_error(py: Python<'_>, e: GpuError) -> PyErr {
    let module = GPU_EXCEPTIONS.get_or_try_init(py, || {
        py.import("zeus.device.exception").map(|m| m.unbind())
    });
    let class = module.and_then(|m| m.bind(py).getattr(e.class_name()));
    match class {
        Ok(cls) => match cls.call1((e.message().to_string(),)) {
            Ok(instance) => PyErr::from_value(instance),
            Err(err) => err,
        },
        Err(_) => PyRuntimeError::new_err(format!("{}: {}", e.class_name(), e.message())),
    }
}

/// Build the Python exception for a CPU (RAPL) error (classes in `zeus.device.cpu`).
pub(crate) fn cpu_error(py: Python<'_>, e: CpuError) -> PyErr {
    let module =
        CPU_EXCEPTIONS.get_or_try_init(py, || py.import("zeus.device.cpu").map(|m| m.unbind()));
    let class = module.and_then(|m| m.bind(py).getattr(e.class_name()));
    match class {
        Ok(cls) => match cls.call1((e.to_string(),)) {
            Ok(instance) => PyErr::from_value(instance),
            Err(err) => err,
        },
        Err(_) => PyRuntimeError::new_err(format!("{}: {e}", e.class_name())),
    }
}

/// `Result<T, GpuError>` to `PyResult<T>`.
pub(crate) trait IntoPyResult<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, GpuError> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| gpu_error(py, e))
    }
}
