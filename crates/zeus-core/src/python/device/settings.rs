//! `zeus._core` bindings for GPU settings that outlive the process (`crate::device::settings`):
//! the settings guard, the journal listing and the restore of what dead processes left.
//! `zeus.device.settings` wraps them and installs the exit and signal hooks.

use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::PyGpus;
use crate::device::settings::{
    self, Entry, Journal, Notice, Original, Owner, Released, SettingsError, SettingsGuard,
};
use crate::python::errors::gpu_error;

fn journal_at(dir: Option<PathBuf>) -> Journal {
    dir.map(Journal::at)
        .unwrap_or_else(Journal::default_location)
}

fn settings_err(py: Python<'_>, e: SettingsError) -> PyErr {
    match e {
        SettingsError::Io(e) => PyOSError::new_err(e.to_string()),
        SettingsError::Gpu(e) => gpu_error(py, e),
    }
}

/// Log through Python's `logging` (logger `zeus.device.settings`), so notices reach the
/// application's handlers like every other zeus message.
fn warn(py: Python<'_>, message: &str) -> PyResult<()> {
    py.import("logging")?
        .call_method1("getLogger", ("zeus.device.settings",))?
        .call_method1("warning", ("%s", message))?;
    Ok(())
}

/// Raise the error of a guarded change, or log its notices.
fn changed(py: Python<'_>, result: Result<Vec<Notice>, SettingsError>) -> PyResult<()> {
    for n in result.map_err(|e| settings_err(py, e))? {
        warn(py, &n.to_string())?;
    }
    Ok(())
}

fn set_original(d: &Bound<'_, PyDict>, original: Original) -> PyResult<()> {
    d.set_item("kind", original.kind().name())?;
    match original {
        Original::PowerLimit(mw) => d.set_item("power_limit_mw", mw),
        Original::Unlock(l) => {
            d.set_item("gpu_clocks", l.gpu)?;
            d.set_item("memory_clocks", l.memory)
        }
    }
}

fn holders_list<'py>(py: Python<'py>, holders: &[Owner]) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for h in holders {
        let d = PyDict::new(py);
        d.set_item("pid", h.pid)?;
        d.set_item("start_time", h.start_time)?;
        d.set_item("boot_id", &h.boot_id)?;
        d.set_item("alive", h.is_alive())?;
        out.append(d)?;
    }
    Ok(out)
}

fn entry_dict<'py>(py: Python<'py>, e: &Entry) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("uuid", &e.uuid)?;
    set_original(&d, e.original)?;
    d.set_item("holders", holders_list(py, &e.holders)?)?;
    d.set_item("pid", e.holders.first().map(|h| h.pid))?;
    d.set_item("created", e.created)?;
    Ok(d)
}

/// The journal directory in use (`$ZEUS_STATE_DIR`, `$XDG_STATE_HOME/zeus`,
/// `~/.local/state/zeus`, `/var/lib/zeus` for root, `/var/tmp/zeus-<uid>`).
#[pyfunction]
fn journal_dir() -> PathBuf {
    settings::journal::default_dir()
}

/// Every readable journal entry, sorted by UUID, power limits first. Dicts with `uuid`, `kind`
/// (`power_limit` or `clocks`), `power_limit_mw` or `gpu_clocks`/`memory_clocks`, `holders`
/// (dicts with `pid`, `start_time`, `boot_id`, `alive`), `pid` (the first holder's) and `created`.
#[pyfunction]
#[pyo3(signature = (dir = None))]
fn journal_entries<'py>(
    py: Python<'py>,
    dir: Option<PathBuf>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let scan = journal_at(dir)
        .scan()
        .map_err(|e| PyOSError::new_err(e.to_string()))?;
    scan.entries.iter().map(|e| entry_dict(py, e)).collect()
}

/// Journal files that cannot be read as entries: dicts with `path`, `kind`, `uuid` (from the
/// file name) and `reason`. A restore moves them aside and applies the driver's default.
#[pyfunction]
#[pyo3(signature = (dir = None))]
fn journal_unreadable<'py>(
    py: Python<'py>,
    dir: Option<PathBuf>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let scan = journal_at(dir)
        .scan()
        .map_err(|e| PyOSError::new_err(e.to_string()))?;
    scan.corrupt
        .iter()
        .map(|c| {
            let d = PyDict::new(py);
            d.set_item("path", &c.path)?;
            d.set_item("kind", c.kind.name())?;
            d.set_item("uuid", &c.uuid_in_name)?;
            d.set_item("reason", &c.reason)?;
            Ok(d)
        })
        .collect()
}

/// Undo every journaled change on `gpus` that no running process holds (every change, with
/// `include_live`): power limits set back, locked clocks reset, entries cleared. Unreadable
/// entries are moved aside and their GPU gets the driver's default.
///
/// Every kind on every GPU is tried. Returns `(restored, failed)`: `restored` dicts have
/// `index, uuid, kind, power_limit_mw` or `gpu_clocks, memory_clocks`, `original_known`, `pids`
/// and `description` (one line for people); `failed` dicts have `index, uuid (or None), kind (or
/// None), error` (the exception: a `ZeusGPUError` subclass or `OSError`) and `description`;
/// their entries stay journaled.
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
    let report = py.detach(|| settings::restore_stale(&j, &g.inner, include_live));
    let mut restored = Vec::with_capacity(report.restored.len());
    for r in &report.restored {
        let d = PyDict::new(py);
        d.set_item("index", r.index)?;
        d.set_item("uuid", &r.uuid)?;
        set_original(&d, r.applied)?;
        d.set_item("original_known", r.original_known)?;
        d.set_item("pids", r.holders.iter().map(|h| h.pid).collect::<Vec<_>>())?;
        d.set_item("description", r.to_string())?;
        restored.push(d);
    }
    let mut failed = Vec::with_capacity(report.failed.len());
    for f in report.failed {
        let d = PyDict::new(py);
        d.set_item("index", f.index)?;
        d.set_item("uuid", &f.uuid)?;
        d.set_item("kind", f.kind.map(settings::Kind::name))?;
        d.set_item("description", f.to_string())?;
        d.set_item("error", settings_err(py, f.error).into_value(py))?;
        failed.push(d);
    }
    Ok((restored, failed))
}

/// Restore every settings guard of this process (exit and signal hooks). Returns the errors,
/// as exceptions; every guard and setting is tried.
#[pyfunction]
fn restore_all_settings(py: Python<'_>) -> Vec<Py<PyAny>> {
    py.detach(settings::restore_all)
        .into_iter()
        .map(|e| settings_err(py, e).into_value(py).into_any())
        .collect()
}

/// Changes GPU settings that outlive the process (power limits, locked clocks) and guarantees
/// the originals come back: journaled before the first change, restored by `restore()`, when
/// the guard is garbage-collected, by `restore_all_settings()`, and after a SIGKILL by the next
/// `journal_restore`. Several processes may hold one GPU; the last one out restores.
///
/// Use it through `zeus.device.settings.SettingsGuard`, which also installs the exit and
/// signal hooks.
#[pyclass(name = "SettingsGuard", module = "zeus._core.settings", frozen)]
pub(crate) struct PySettingsGuard {
    inner: SettingsGuard,
}

#[pymethods]
impl PySettingsGuard {
    /// `owner_pid`: hold the changes on behalf of that running process (a daemon acting for
    /// a client); default this process. `ValueError` if no such process runs.
    #[new]
    #[pyo3(signature = (gpus, journal_dir = None, owner_pid = None))]
    fn new(
        gpus: &Bound<'_, PyGpus>,
        journal_dir: Option<PathBuf>,
        owner_pid: Option<u32>,
    ) -> PyResult<Self> {
        let gpus = gpus.get().inner.clone();
        let journal = journal_at(journal_dir);
        let inner = match owner_pid {
            None => SettingsGuard::new(gpus, journal),
            Some(pid) => {
                let owner = Owner::of_pid(pid).ok_or_else(|| {
                    PyValueError::new_err(format!("owner_pid {pid} is not a running process"))
                })?;
                SettingsGuard::on_behalf_of(gpus, journal, owner)
            }
        };
        Ok(PySettingsGuard { inner })
    }

    /// The journal directory this guard writes to.
    #[getter]
    fn journal_dir(&self) -> PathBuf {
        self.inner.journal().dir().to_path_buf()
    }

    /// Whether some setting is changed and not yet restored.
    #[getter]
    fn active(&self) -> bool {
        self.inner.is_active()
    }

    /// The power limit GPU `gpu_index` returns to, mW, if this guard changed it.
    fn original_power_limit(&self, gpu_index: usize) -> Option<u32> {
        self.inner.original_power_limit(gpu_index)
    }

    /// Set the power limit (mW), journaling the original before the first change.
    fn set_power_limit(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        power_limit_mw: u32,
    ) -> PyResult<()> {
        changed(
            py,
            py.detach(|| self.inner.set_power_limit(gpu_index, power_limit_mw)),
        )
    }

    /// Lock the graphics clocks to `[min_clock_mhz, max_clock_mhz]`, journaling first.
    fn lock_gpu_clocks(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        min_clock_mhz: u32,
        max_clock_mhz: u32,
    ) -> PyResult<()> {
        let inner = &self.inner;
        changed(
            py,
            py.detach(|| inner.lock_gpu_clocks(gpu_index, min_clock_mhz, max_clock_mhz)),
        )
    }

    /// Lock the memory clocks to `[min_clock_mhz, max_clock_mhz]`, journaling first.
    fn lock_memory_clocks(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        min_clock_mhz: u32,
        max_clock_mhz: u32,
    ) -> PyResult<()> {
        let inner = &self.inner;
        changed(
            py,
            py.detach(|| inner.lock_memory_clocks(gpu_index, min_clock_mhz, max_clock_mhz)),
        )
    }

    /// Put everything back (a setting another running process still holds stays as that
    /// process set it). Every setting is tried; raises the first error. Idempotent. Returns
    /// one line per setting for people.
    fn restore(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let released = py
            .detach(|| self.inner.restore())
            .map_err(|e| settings_err(py, e))?;
        Ok(released.iter().map(Released::to_string).collect())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySettingsGuard>()?;
    m.add_function(wrap_pyfunction!(journal_dir, m)?)?;
    m.add_function(wrap_pyfunction!(journal_entries, m)?)?;
    m.add_function(wrap_pyfunction!(journal_unreadable, m)?)?;
    m.add_function(wrap_pyfunction!(journal_restore, m)?)?;
    m.add_function(wrap_pyfunction!(restore_all_settings, m)?)?;
    Ok(())
}
