//! `zeus._core` bindings for power_limit: the optimum selectors and the GPU settings journal
//! (power limits and locked clocks; see `crate::device::journal`).

use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::device::PyGpus;
use super::errors::gpu_error;
use crate::device::journal::{
    self, ClockEntry, ClockLocks, Entry, Journal, JournalEntry, JournalError, Kind, Restored,
    RestoredSetting,
};
use crate::optimizer::power_limit::{Measurement, Selector, SelectorError};

fn selector_err(e: SelectorError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A built-in optimum selector. `zeus.optimizer.power_limit` wraps it in the public classes.
#[pyclass(name = "PowerLimitSelector", module = "zeus._core", frozen)]
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

fn journal_at(dir: Option<PathBuf>) -> Journal {
    dir.map(Journal::at)
        .unwrap_or_else(Journal::default_location)
}

fn io_err(e: std::io::Error) -> PyErr {
    PyOSError::new_err(e.to_string())
}

fn journal_err(py: Python<'_>, e: JournalError) -> PyErr {
    match e {
        JournalError::Io(e) => io_err(e),
        JournalError::Gpu(e) => gpu_error(py, e),
    }
}

fn entry_dict<'py>(py: Python<'py>, e: &JournalEntry) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kind", Kind::PowerLimit.name())?;
    d.set_item("uuid", &e.uuid)?;
    d.set_item("power_limit_mw", e.power_limit_mw)?;
    d.set_item("pid", e.pid)?;
    d.set_item("created", e.created)?;
    Ok(d)
}

fn clock_entry_dict<'py>(py: Python<'py>, e: &ClockEntry) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kind", Kind::Clocks.name())?;
    d.set_item("uuid", &e.uuid)?;
    d.set_item("gpu_clocks", e.locks.gpu)?;
    d.set_item("memory_clocks", e.locks.memory)?;
    d.set_item("pid", e.pid)?;
    d.set_item("created", e.created)?;
    Ok(d)
}

/// The journal directory in use (`$ZEUS_STATE_DIR`, `$XDG_STATE_HOME/zeus`,
/// `~/.local/state/zeus`, `/var/tmp/zeus`).
#[pyfunction]
fn journal_dir() -> PathBuf {
    journal::default_dir()
}

/// Journal `uuid`'s original power limit unless an entry exists; returns the entry on disk.
#[pyfunction]
#[pyo3(signature = (uuid, power_limit_mw, dir = None))]
fn journal_record<'py>(
    py: Python<'py>,
    uuid: &str,
    power_limit_mw: u32,
    dir: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    let j = journal_at(dir);
    let e = py
        .detach(|| j.record(uuid, power_limit_mw))
        .map_err(io_err)?;
    entry_dict(py, &e)
}

/// Journal that this process is about to lock `uuid`'s GPU and/or memory clocks; an existing
/// entry is kept (widened to name both sets of kinds). Returns the entry on disk.
///
/// `ValueError` if neither kind is given.
#[pyfunction]
#[pyo3(signature = (uuid, gpu_clocks, memory_clocks, dir = None))]
fn journal_record_clocks<'py>(
    py: Python<'py>,
    uuid: &str,
    gpu_clocks: bool,
    memory_clocks: bool,
    dir: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    let locks = ClockLocks {
        gpu: gpu_clocks,
        memory: memory_clocks,
    };
    if locks.is_empty() {
        return Err(PyValueError::new_err(
            "journal_record_clocks needs gpu_clocks or memory_clocks to be True \
             (got gpu_clocks=False, memory_clocks=False)",
        ));
    }
    let j = journal_at(dir);
    let e = py.detach(|| j.record_clocks(uuid, locks)).map_err(io_err)?;
    clock_entry_dict(py, &e)
}

/// `uuid`'s power-limit entry as a dict, or `None`.
#[pyfunction]
#[pyo3(signature = (uuid, dir = None))]
fn journal_get<'py>(
    py: Python<'py>,
    uuid: &str,
    dir: Option<PathBuf>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let j = journal_at(dir);
    match j.get(uuid).map_err(io_err)? {
        Some(e) => Ok(Some(entry_dict(py, &e)?)),
        None => Ok(None),
    }
}

/// `uuid`'s clock entry as a dict, or `None`.
#[pyfunction]
#[pyo3(signature = (uuid, dir = None))]
fn journal_get_clocks<'py>(
    py: Python<'py>,
    uuid: &str,
    dir: Option<PathBuf>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let j = journal_at(dir);
    match j.get_clocks(uuid).map_err(io_err)? {
        Some(e) => Ok(Some(clock_entry_dict(py, &e)?)),
        None => Ok(None),
    }
}

/// Every entry of every kind (each dict has a `kind`: `power_limit` or `clocks`), sorted by
/// UUID.
#[pyfunction]
#[pyo3(signature = (dir = None))]
fn journal_entries<'py>(
    py: Python<'py>,
    dir: Option<PathBuf>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let j = journal_at(dir);
    let entries = j.all_entries().map_err(io_err)?;
    entries
        .iter()
        .map(|e| match e {
            Entry::PowerLimit(e) => entry_dict(py, e),
            Entry::Clocks(e) => clock_entry_dict(py, e),
        })
        .collect()
}

/// Remove `uuid`'s power-limit entry; returns whether there was one.
#[pyfunction]
#[pyo3(signature = (uuid, dir = None))]
fn journal_clear(uuid: &str, dir: Option<PathBuf>) -> PyResult<bool> {
    journal_at(dir).clear(uuid).map_err(io_err)
}

/// Remove `uuid`'s clock entry; returns whether there was one.
#[pyfunction]
#[pyo3(signature = (uuid, dir = None))]
fn journal_clear_clocks(uuid: &str, dir: Option<PathBuf>) -> PyResult<bool> {
    journal_at(dir).clear_clocks(uuid).map_err(io_err)
}

/// Whether process `pid` is running.
#[pyfunction]
fn process_alive(pid: u32) -> bool {
    journal::process_alive(pid)
}

fn restored_dict<'py>(py: Python<'py>, r: &Restored) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("index", r.index)?;
    d.set_item("uuid", &r.uuid)?;
    d.set_item("kind", r.setting.kind().name())?;
    d.set_item("pid", r.pid)?;
    match r.setting {
        RestoredSetting::PowerLimit { power_limit_mw } => {
            d.set_item("power_limit_mw", power_limit_mw)?;
        }
        RestoredSetting::Clocks(locks) => {
            d.set_item("gpu_clocks", locks.gpu)?;
            d.set_item("memory_clocks", locks.memory)?;
        }
    }
    Ok(d)
}

/// Undo every journaled change on `gpus` left by dead processes (or by anyone, with
/// `include_live`): power limits set back, locked clocks reset; those entries are cleared.
///
/// Every kind on every GPU is tried. Returns `(restored, failed)`: `restored` dicts have
/// `index, uuid, kind, pid` and `power_limit_mw` or `gpu_clocks, memory_clocks`; `failed` dicts
/// have `index, uuid (or None), kind (or None), error` (the exception, e.g. a `ZeusGPUError`
/// subclass or `OSError`), and their entries stay journaled.
#[pyfunction]
#[pyo3(signature = (gpus, include_live = false, dir = None))]
#[allow(clippy::type_complexity)]
fn journal_restore<'py>(
    py: Python<'py>,
    gpus: &Bound<'py, PyGpus>,
    include_live: bool,
    dir: Option<PathBuf>,
) -> PyResult<(Vec<Bound<'py, PyDict>>, Vec<Bound<'py, PyDict>>)> {
    let j = journal_at(dir);
    let g = gpus.get();
    let report = py.detach(|| j.restore_stale(&g.inner, include_live));
    let restored = report
        .restored
        .iter()
        .map(|r| restored_dict(py, r))
        .collect::<PyResult<Vec<_>>>()?;
    let mut failed = Vec::with_capacity(report.failed.len());
    for f in report.failed {
        let d = PyDict::new(py);
        d.set_item("index", f.index)?;
        d.set_item("uuid", f.uuid)?;
        d.set_item("kind", f.kind.map(Kind::name))?;
        d.set_item("error", journal_err(py, f.error).into_value(py))?;
        failed.push(d);
    }
    Ok((restored, failed))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySelector>()?;
    m.add_function(wrap_pyfunction!(journal_dir, m)?)?;
    m.add_function(wrap_pyfunction!(journal_record, m)?)?;
    m.add_function(wrap_pyfunction!(journal_get, m)?)?;
    m.add_function(wrap_pyfunction!(journal_entries, m)?)?;
    m.add_function(wrap_pyfunction!(journal_clear, m)?)?;
    m.add_function(wrap_pyfunction!(journal_record_clocks, m)?)?;
    m.add_function(wrap_pyfunction!(journal_get_clocks, m)?)?;
    m.add_function(wrap_pyfunction!(journal_clear_clocks, m)?)?;
    m.add_function(wrap_pyfunction!(journal_restore, m)?)?;
    m.add_function(wrap_pyfunction!(process_alive, m)?)?;
    Ok(())
}
