//! `ZeusMonitor` (the Rust half of `zeus.monitor.ZeusMonitor`): measurement windows, and the
//! process's sampler thread.

use super::measurement::make_measurement;
use super::power::PyPowerMonitor;
use super::*;

struct MonitorState {
    core: Mutex<EnergyMonitor>,
    gpus: Gpus,
    indices: Vec<usize>,
    /// `resolve_sync()` returns the framework's `sync(gpu_index)` or `None`; it is called on
    /// the first window that asks for a sync, so that merely creating a monitor never imports
    /// a framework (importing PyTorch takes seconds).
    resolve_sync: Option<Py<PyAny>>,
    /// The framework's sync, once `resolve_sync` found one.
    sync: OnceLock<Py<PyAny>>,
    /// `sys.modules`, and its size when `resolve_sync` last found nothing: a framework can
    /// only have appeared since if a module was imported, so until the size changes the
    /// window skips the Python call (it sits on every synced window edge).
    modules: Py<PyDict>,
    unresolved_at: AtomicUsize,
    approx: bool,
}

/// Rust half of `zeus.monitor.ZeusMonitor`: `_init` sets it up (from the Python `__init__`),
/// and `begin_window` / `end_window` are called directly.
#[pyclass(name = "ZeusMonitor", module = "zeus._core.monitor", frozen, subclass)]
pub(crate) struct PyZeusMonitor {
    state: OnceLock<MonitorState>,
}

impl PyZeusMonitor {
    fn state(&self) -> PyResult<&MonitorState> {
        self.state.get().ok_or_else(|| {
            PyRuntimeError::new_err(
                "ZeusMonitor is not initialised: call ZeusMonitor.__init__ first",
            )
        })
    }
}

impl PyZeusMonitor {
    /// Run `f` on the Rust monitor (for the serving ledger, which cuts a window of its own at
    /// every engine step without a Python call in between).
    pub(super) fn with_core<R>(&self, f: impl FnOnce(&mut EnergyMonitor) -> R) -> PyResult<R> {
        Ok(f(&mut lock(&self.state()?.core)))
    }

    /// The monitor's GPU indices and its clock (s).
    pub(super) fn indices_and_now(&self) -> PyResult<(Vec<usize>, f64)> {
        let st = self.state()?;
        Ok((st.indices.clone(), st.gpus.now()))
    }

    /// The monitor's clock (s).
    pub(super) fn now(&self) -> PyResult<f64> {
        Ok(self.state()?.gpus.now())
    }
}

fn lock(m: &Mutex<EnergyMonitor>) -> MutexGuard<'_, EnergyMonitor> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn sync_all(py: Python<'_>, st: &MonitorState) -> PyResult<()> {
    let sync = match st.sync.get() {
        Some(f) => f,
        None => {
            let Some(resolve) = &st.resolve_sync else {
                return Ok(());
            };
            let n_modules = st.modules.bind(py).len();
            if st.unresolved_at.load(Ordering::Relaxed) == n_modules {
                return Ok(()); // nothing imported since the last miss
            }
            let f = resolve.call0(py)?;
            if f.is_none(py) {
                // No framework to sync with yet: ask again once something is imported (until
                // then nothing can have been queued through one).
                st.unresolved_at.store(n_modules, Ordering::Relaxed);
                return Ok(());
            }
            // Another thread may have won the race; either result is the same function.
            let _ = st.sync.set(f);
            st.sync.get().expect("just set")
        }
    };
    for &i in &st.indices {
        sync.call1(py, (i,))?;
    }
    Ok(())
}

/// Whether a window edge syncs: `sync_cuda` (zeus 0.8) or `sync_execution` (Zeus 0.16's name of
/// the same flag), true when neither is given.
fn sync_flag(sync_cuda: Option<bool>, sync_execution: Option<bool>) -> PyResult<bool> {
    match (sync_cuda, sync_execution) {
        (Some(a), Some(b)) if a != b => Err(PyValueError::new_err(format!(
            "sync_cuda={} and sync_execution={} disagree: they are one setting \
             (sync_execution is its Zeus 0.16 name), give one",
            py_bool(a),
            py_bool(b)
        ))),
        (a, b) => Ok(a.or(b).unwrap_or(true)),
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

#[pymethods]
impl PyZeusMonitor {
    /// Accepts and ignores any arguments, so Python subclasses may define their own
    /// `__init__`; the real set-up is `_init`.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        PyZeusMonitor {
            state: OnceLock::new(),
        }
    }

    /// Set up: `gpus` is a `zeus.device.GPUs`, `resolve_sync` a callable returning the
    /// framework's `sync(gpu_index)` or `None` (called once, on first use),
    /// `check_power` a `PowerMonitor` to cross-check counter energies against. Returns the
    /// `PowerMonitor` made for GPUs without an energy counter, or `None`. `gpus=None` (with
    /// `gpu_indices=[]` and CPUs) makes a CPU-only monitor on the system clock; `cpus` is a
    /// `zeus.device.cpu.CPUs` and `cpu_indices` the packages to measure.
    #[pyo3(signature = (gpus, gpu_indices, approx_instant_energy, log_file, resolve_sync, check_power, reads = "auto", cpus = None, cpu_indices = None))]
    #[allow(clippy::too_many_arguments)]
    fn _init(
        &self,
        py: Python<'_>,
        gpus: Option<&Bound<'_, PyAny>>,
        gpu_indices: Option<Vec<usize>>,
        approx_instant_energy: bool,
        log_file: Option<PathBuf>,
        resolve_sync: Option<Py<PyAny>>,
        check_power: Option<&Bound<'_, PyPowerMonitor>>,
        reads: &str,
        cpus: Option<&Bound<'_, PyCpus>>,
        cpu_indices: Option<Vec<usize>>,
    ) -> PyResult<Option<Py<PyPowerMonitor>>> {
        let g = match gpus {
            Some(obj) => core_gpus(obj)?,
            None => Gpus::with_indices(
                crate::device::BackendKind::Nvml,
                Vec::new(),
                Vec::new(),
                Arc::new(crate::device::SystemClock),
            ),
        };
        let cpu = match (cpus, cpu_indices) {
            (Some(c), Some(i)) => Some((c.get().inner.clone(), i)),
            (None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "cpus and cpu_indices go together: give both or neither",
                ))
            }
        };
        let check = check_power.map(|p| p.get().inner.clone());
        let reads = ReadMode::parse(reads).py_err(py)?;
        let g2 = g.clone();
        let core = py
            .detach(move || {
                EnergyMonitor::with_cpus(
                    g2,
                    gpu_indices,
                    cpu.as_ref().map(|(c, i)| (c, i.clone())),
                    log_file.as_deref(),
                    check,
                    reads,
                )
            })
            .py_err(py)?;
        let own = core
            .power_monitor()
            .map(|pm| Py::new(py, PyPowerMonitor { inner: pm.clone() }))
            .transpose()?;
        let indices = core.gpu_indices().to_vec();
        self.state
            .set(MonitorState {
                core: Mutex::new(core),
                gpus: g,
                indices,
                resolve_sync,
                sync: OnceLock::new(),
                modules: py
                    .import("sys")?
                    .getattr("modules")?
                    .cast_into::<PyDict>()
                    .map_err(PyErr::from)?
                    .unbind(),
                unresolved_at: AtomicUsize::new(usize::MAX),
                approx: approx_instant_energy,
            })
            .map_err(|_| PyRuntimeError::new_err("ZeusMonitor is already initialised"))?;
        Ok(own)
    }

    /// Open measurement window `key` (see `zeus.monitor.ZeusMonitor`). With `restart` (Zeus
    /// 0.16), an open window of that name is dropped and opened again instead of refused.
    #[pyo3(signature = (key, sync_cuda = None, *, sync_execution = None, restart = false))]
    fn begin_window(
        &self,
        py: Python<'_>,
        key: PyBackedStr,
        sync_cuda: Option<bool>,
        sync_execution: Option<bool>,
        restart: bool,
    ) -> PyResult<()> {
        let st = self.state()?;
        if sync_flag(sync_cuda, sync_execution)? {
            sync_all(py, st)?;
        }
        // The GIL is kept: the reads take a microsecond or so, and releasing and retaking it
        // would cost a good share of that (the mutex is never awaited without the GIL held,
        // so this cannot deadlock).
        let mut core = lock(&st.core);
        if restart && core.is_open(&key) {
            core.end_window(&key, true, None).py_err(py)?;
        }
        core.begin_window(&key).py_err(py)
    }

    /// Close measurement window `key` and return its `Measurement` (see
    /// `zeus.monitor.ZeusMonitor`).
    #[pyo3(signature = (key, sync_cuda = None, cancel = false, exact = false, *, sync_execution = None))]
    fn end_window(
        &self,
        py: Python<'_>,
        key: PyBackedStr,
        sync_cuda: Option<bool>,
        cancel: bool,
        exact: bool,
        sync_execution: Option<bool>,
    ) -> PyResult<Py<PyMeasurement>> {
        let st = self.state()?;
        let sync_cuda = sync_flag(sync_cuda, sync_execution)?;
        // Instantaneous power is read before the sync, as the reference does: the sync waits
        // for the kernels whose power we want to see.
        let instant = if st.approx && !cancel {
            Some(InstantPower::read(&st.gpus, &st.indices).map_err(|e| gpu_error(py, e))?)
        } else {
            None
        };
        if sync_cuda {
            sync_all(py, st)?;
        }
        let out = if exact && !cancel {
            // Waits for the counter's next update: let other Python threads run meanwhile.
            let instant = instant.as_ref();
            py.detach(|| lock(&st.core).end_window_with(&key, cancel, instant, true))
        } else {
            lock(&st.core).end_window_with(&key, cancel, instant.as_ref(), false)
        }
        .py_err(py)?;
        if !out.warnings.is_empty() {
            warn(py, &out.warnings)?;
        }
        make_measurement(py, out.measurement)
    }

    /// Close window `key` and reopen it at the same instant from the same reads: the
    /// `Measurement` of the slice since the window opened or was last cut. Consecutive slices
    /// add up to the whole window (an `end_window` then a `begin_window` would lose the energy
    /// between their reads). `sync_cuda` (default False: cuts usually come from a thread of
    /// their own) waits for queued GPU work first.
    #[pyo3(signature = (key, sync_cuda = false))]
    fn cut_window(
        &self,
        py: Python<'_>,
        key: PyBackedStr,
        sync_cuda: bool,
    ) -> PyResult<Py<PyMeasurement>> {
        let st = self.state()?;
        if sync_cuda {
            sync_all(py, st)?;
        }
        let out = lock(&st.core).cut_window(&key).py_err(py)?;
        if !out.warnings.is_empty() {
            warn(py, &out.warnings)?;
        }
        make_measurement(py, out.measurement)
    }

    /// Turn off (or on) the warning for windows shorter than the counter's update period, for
    /// monitors whose windows are cut at boundaries of a program's own (`zeus.monitor.carbon`).
    fn _set_short_window_warnings(&self, on: bool) -> PyResult<()> {
        lock(&self.state()?.core).set_short_window_warnings(on);
        Ok(())
    }

    /// Open windows: `{key: (start_time, {gpu_index: J}, {package: J} | None,
    /// {package: J} | None)}`, the start energies of counter GPUs, CPU packages and DRAM
    /// (`zeus.monitor.energy` makes each a `MeasurementState`).
    fn _window_starts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.state()?;
        let open = lock(&st.core).open_windows();
        let dict = |pairs: &[(usize, f64)]| -> PyResult<Bound<'py, PyDict>> {
            let d = PyDict::new(py);
            for (i, j) in pairs {
                d.set_item(i, j)?;
            }
            Ok(d)
        };
        let out = PyDict::new(py);
        for w in open {
            let cpu = w.cpu_energy.as_deref().map(dict).transpose()?;
            let dram = w.dram_energy.as_deref().map(dict).transpose()?;
            out.set_item(w.key, (w.time, dict(&w.gpu_energy)?, cpu, dram))?;
        }
        Ok(out)
    }

    /// Monitored CPU packages, or `None` when no CPU is monitored.
    #[getter]
    fn cpu_indices(&self) -> PyResult<Option<Vec<usize>>> {
        Ok(lock(&self.state()?.core).cpu_indices().map(|i| i.to_vec()))
    }

    /// Whether each monitored GPU has a total-energy counter (Volta and newer).
    #[getter]
    fn _has_counter(&self) -> PyResult<Vec<bool>> {
        Ok(lock(&self.state()?.core).has_counter().to_vec())
    }

    #[getter]
    fn approx_instant_energy(&self) -> PyResult<bool> {
        Ok(self.state()?.approx)
    }

    /// How energy counters are read: `"auto"`, `"cached"` or `"direct"`, as asked for.
    #[getter]
    fn reads(&self) -> PyResult<&'static str> {
        Ok(lock(&self.state()?.core).reads().name())
    }

    /// Per monitored GPU: whether its counter is read through the sampler's cache.
    #[getter]
    fn _reads_cached(&self) -> PyResult<Vec<bool>> {
        Ok(lock(&self.state()?.core).reads_cached())
    }
}

/// The sampling period `PowerMonitor` picks for `gpu_indices`: half the shortest power update
/// period among their models (the backend's figure, or detected by watching the reading
/// change), at most 0.1 s. Fixes the reference, whose inference always returned 0.
#[pyfunction]
#[pyo3(signature = (gpu_indices))]
pub(super) fn infer_counter_update_period(
    py: Python<'_>,
    gpu_indices: Vec<usize>,
) -> PyResult<f64> {
    let gpus = core_gpus(&default_gpus(py)?)?;
    py.detach(|| {
        crate::monitor::power::check_indices(&gpus, &gpu_indices)?;
        Ok(crate::monitor::infer_counter_update_period(
            &gpus,
            &gpu_indices,
        )?)
    })
    .py_err(py)
}

/// Stop the process's energy sampler thread (registered with `atexit`, so that nothing of ours
/// runs while the interpreter finalises). Monitors keep answering from what was cached.
#[pyfunction]
pub(super) fn stop_sampler(py: Python<'_>) {
    py.detach(crate::monitor::sampler::Sampler::stop_current);
}
