//! `zeus._core` bindings for measurement, one file per class: `measurement.rs` (`Measurement`,
//! `Provenance`), `energy.rs` (`ZeusMonitor`, the Rust half of `zeus.monitor.ZeusMonitor`),
//! `power.rs` (`PowerMonitor`), `temperature.rs` (`TemperatureMonitor`) and `power_log.rs`
//! (`PowerLog`). This file holds what they share: error conversion and the GPUs behind a
//! `zeus.device.GPUs` object.
//!
//! The window methods are the hot path: one Python-to-Rust call each, the GIL released around
//! the device reads, and a `Measurement` whose energy dict is only built when someone asks.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyUserWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyDict, PyTuple};

use super::device::cpu::PyCpus;
use super::device::PyGpus;
use super::errors::{cpu_error, gpu_error};
use crate::device::Gpus;
use crate::monitor::{
    EnergyMonitor, InstantPower, Method, MonitorError, PowerDomain, PowerMonitor,
    PowerMonitorOptions, Provenance, ReadMode,
};

fn monitor_error(py: Python<'_>, e: MonitorError) -> PyErr {
    match e {
        MonitorError::InvalidArg(m) => PyValueError::new_err(m),
        MonitorError::Gpu(g) => gpu_error(py, g),
        MonitorError::Cpu(c) => cpu_error(py, c),
        MonitorError::Stopped(m) => PyRuntimeError::new_err(m),
        MonitorError::Io(io) => PyOSError::new_err(io.to_string()),
    }
}

trait IntoPy<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, MonitorError> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| monitor_error(py, e))
    }
}

fn warn(py: Python<'_>, messages: &[String]) -> PyResult<()> {
    for m in messages {
        let msg = CString::new(m.replace('\0', " ")).unwrap_or_default();
        PyErr::warn(py, &py.get_type::<PyUserWarning>(), &msg, 1)?;
    }
    Ok(())
}

/// The name of `obj`'s type, for an error message.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// The `Gpus` behind a `zeus.device.GPUs` object.
fn core_gpus(obj: &Bound<'_, PyAny>) -> PyResult<Gpus> {
    let g = obj.cast::<PyGpus>().map_err(|_| {
        PyValueError::new_err(format!(
            "expected a zeus.device.GPUs object, got {}",
            type_name(obj)
        ))
    })?;
    Ok(g.get().inner.clone())
}

fn default_gpus(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("zeus.device")?.getattr("get_gpus")?.call0()
}

mod energy;
mod measurement;
mod power;
mod power_log;
mod serving;
mod temperature;

use energy::{infer_counter_update_period, stop_sampler, PyZeusMonitor};
use measurement::{PyMeasurement, PyProvenance};
use power::PyPowerMonitor;
use temperature::PyTemperatureMonitor;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    power_log::register(m)?;
    m.add_function(wrap_pyfunction!(infer_counter_update_period, m)?)?;
    m.add_function(wrap_pyfunction!(stop_sampler, m)?)?;
    m.add_class::<PyMeasurement>()?;
    m.add_class::<PyProvenance>()?;
    m.add_class::<PyPowerMonitor>()?;
    m.add_class::<PyZeusMonitor>()?;
    m.add_class::<PyTemperatureMonitor>()?;
    m.add_class::<serving::PyEnergyLedger>()?;
    Ok(())
}
