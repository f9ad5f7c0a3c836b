//! `zeus._core` bindings for measurement: `Measurement`, `ZeusMonitor` (the Rust half of
//! `zeus.monitor.ZeusMonitor`) and `PowerMonitor`.
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

/// The `Gpus` behind a `zeus.device.GPUs` object.
fn core_gpus(obj: &Bound<'_, PyAny>) -> PyResult<Gpus> {
    let g = obj.cast::<PyGpus>().map_err(|_| {
        PyValueError::new_err(format!(
            "expected a zeus.device.GPUs object, got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    Ok(g.get().inner.clone())
}

fn default_gpus(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("zeus.device")?.getattr("get_gpus")?.call0()
}

/// How one device's energy in one window was made.
///
/// Attributes:
///     method: `"cached_counter"` (the sampler's cache: counter values at calibrated moments
///         and the power readings between), `"direct_counter"` (the counter read at the
///         window's edges), `"power_integration"` (power readings integrated) or `"degraded"`
///         (part of the window had no readings, or the counter reset within it: the figure
///         rests on what the device can draw there, which its bound says).
///     update_period: Seconds between the readings' updates used, where known.
///     counter_lag: Seconds between the moment a counter value describes and when the driver
///         shows it, as the sampler measured it, or `None`.
///     note: Why the figure was not made the usual way, or `None`.
#[pyclass(
    name = "Provenance",
    module = "zeus.monitor",
    frozen,
    eq,
    skip_from_py_object
)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyProvenance {
    #[pyo3(get)]
    method: &'static str,
    #[pyo3(get)]
    update_period: Option<f64>,
    #[pyo3(get)]
    counter_lag: Option<f64>,
    #[pyo3(get)]
    note: Option<String>,
}

#[pymethods]
impl PyProvenance {
    #[new]
    #[pyo3(signature = (method, update_period = None, counter_lag = None, note = None))]
    fn new(
        method: &str,
        update_period: Option<f64>,
        counter_lag: Option<f64>,
        note: Option<String>,
    ) -> PyResult<Self> {
        let method = [
            Method::CachedCounter,
            Method::DirectCounter,
            Method::PowerIntegration,
            Method::Degraded,
        ]
        .into_iter()
        .map(Method::name)
        .find(|m| *m == method)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "method must be 'cached_counter', 'direct_counter', 'power_integration' or \
                 'degraded', got {method:?}"
            ))
        })?;
        Ok(PyProvenance {
            method,
            update_period,
            counter_lag,
            note,
        })
    }

    fn __repr__(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("None".to_string(), crate::monitor::counter::py_float);
        let mut s = format!(
            "Provenance(method={:?}, update_period={}, counter_lag={}",
            self.method,
            opt(self.update_period),
            opt(self.counter_lag)
        );
        if let Some(n) = &self.note {
            s.push_str(&format!(", note={n:?}"));
        }
        s.push(')');
        s.replace('"', "'")
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let p = slf.get();
        let args = (p.method, p.update_period, p.counter_lag, p.note.clone()).into_pyobject(py)?;
        Ok((slf.get_type().into_any(), args))
    }
}

impl From<&Provenance> for PyProvenance {
    fn from(p: &Provenance) -> PyProvenance {
        PyProvenance {
            method: p.method.name(),
            update_period: p.update_period,
            counter_lag: p.counter_lag,
            note: p.note.clone(),
        }
    }
}

/// Time and energy of one measurement window, and how far each energy may be off.
///
/// Attributes:
///     time: Elapsed time in seconds.
///     energy: GPU index (framework index, after `CUDA_VISIBLE_DEVICES`) to joules.
///     gpu_energy: The same dict as `energy` (Zeus 0.16's name).
///     cpu_energy: CPU package index to joules, or `None` when no CPU was monitored.
///     dram_energy: CPU package index to the joules of its DRAM (packages with a DRAM zone
///         only), or `None` when no CPU was monitored.
///     total_energy: GPU, CPU package and DRAM energy together, joules.
///     gpu_energy_uncertainty: GPU index to the bound of its energy, joules: the true energy
///         lies within `energy ± bound` in about 95% of windows (see
///         `docs/measurement-uncertainty.md` for how it is computed and when it is wide).
///     cpu_energy_uncertainty, dram_energy_uncertainty: The same for CPU packages and their
///         DRAM, or `None` when no CPU was monitored.
///     total_energy_uncertainty: The bounds added up (joules): a bound of `total_energy`.
///     gpu_energy_provenance: GPU index to its `Provenance` (how the energy was made).
///
/// Equality compares the time and the energies, as Zeus's dataclass does; the bounds and
/// provenance describe those figures.
#[pyclass(name = "Measurement", module = "zeus.monitor")]
pub(crate) struct PyMeasurement {
    #[pyo3(get, set)]
    time: f64,
    /// Values as measured; the dict is built from them on first access.
    values: Vec<(usize, f64)>,
    dict: Option<Py<PyDict>>,
    #[pyo3(get, set)]
    cpu_energy: Option<Py<PyDict>>,
    #[pyo3(get, set)]
    dram_energy: Option<Py<PyDict>>,
    /// Bounds and provenance as measured, turned into dicts on first access.
    bounds: Vec<(usize, f64)>,
    bounds_dict: Option<Py<PyDict>>,
    provenance: Vec<(usize, PyProvenance)>,
    provenance_dict: Option<Py<PyDict>>,
    #[pyo3(get, set)]
    cpu_energy_uncertainty: Option<Py<PyDict>>,
    #[pyo3(get, set)]
    dram_energy_uncertainty: Option<Py<PyDict>>,
}

fn dict_sum(py: Python<'_>, d: &Option<Py<PyDict>>) -> PyResult<f64> {
    let mut total = 0.0;
    if let Some(d) = d {
        for v in d.bind(py).values() {
            total += v.extract::<f64>()?;
        }
    }
    Ok(total)
}

fn to_dict(py: Python<'_>, v: Option<Vec<(usize, f64)>>) -> PyResult<Option<Py<PyDict>>> {
    v.map(|v| {
        let d = PyDict::new(py);
        for (i, e) in v {
            d.set_item(i, e)?;
        }
        Ok(d.unbind())
    })
    .transpose()
}

fn as_dict(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Py<PyDict>>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => match o.cast::<PyDict>() {
            Ok(d) => Ok(Some(d.clone().unbind())),
            Err(_) => Ok(Some(
                PyDict::from_sequence(&o.call_method0("items")?)?.unbind(),
            )),
        },
    }
}

/// A dict built once from `values`, kept in `cache`.
fn cached_dict<'py, T: Clone + for<'a> IntoPyObject<'a>>(
    py: Python<'py>,
    cache: &mut Option<Py<PyDict>>,
    values: &[(usize, T)],
) -> PyResult<Bound<'py, PyDict>> {
    if let Some(d) = cache {
        return Ok(d.bind(py).clone());
    }
    let d = PyDict::new(py);
    for (i, v) in values {
        d.set_item(i, v.clone())?;
    }
    *cache = Some(d.clone().unbind());
    Ok(d)
}

impl PyMeasurement {
    fn energy_dict<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cached_dict(py, &mut self.dict, &self.values)
    }
}

#[pymethods]
impl PyMeasurement {
    #[new]
    #[pyo3(signature = (
        time,
        energy,
        cpu_energy = None,
        dram_energy = None,
        gpu_energy_uncertainty = None,
        cpu_energy_uncertainty = None,
        dram_energy_uncertainty = None,
        gpu_energy_provenance = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        time: f64,
        energy: &Bound<'_, PyAny>,
        cpu_energy: Option<&Bound<'_, PyAny>>,
        dram_energy: Option<&Bound<'_, PyAny>>,
        gpu_energy_uncertainty: Option<&Bound<'_, PyAny>>,
        cpu_energy_uncertainty: Option<&Bound<'_, PyAny>>,
        dram_energy_uncertainty: Option<&Bound<'_, PyAny>>,
        gpu_energy_provenance: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let dict = as_dict(Some(energy))?;
        Ok(PyMeasurement {
            time,
            values: Vec::new(),
            dict,
            cpu_energy: as_dict(cpu_energy)?,
            dram_energy: as_dict(dram_energy)?,
            bounds: Vec::new(),
            // Measurements made by hand (Zeus's constructor) say nothing about their bounds.
            bounds_dict: Some(match as_dict(gpu_energy_uncertainty)? {
                Some(d) => d,
                None => PyDict::new(energy.py()).unbind(),
            }),
            provenance: Vec::new(),
            provenance_dict: Some(match as_dict(gpu_energy_provenance)? {
                Some(d) => d,
                None => PyDict::new(energy.py()).unbind(),
            }),
            cpu_energy_uncertainty: as_dict(cpu_energy_uncertainty)?,
            dram_energy_uncertainty: as_dict(dram_energy_uncertainty)?,
        })
    }

    #[getter]
    fn energy<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.energy_dict(py)
    }

    #[setter]
    fn set_energy(&mut self, energy: Bound<'_, PyDict>) {
        self.dict = Some(energy.unbind());
    }

    /// Zeus 0.16's name for `energy` (the same dict).
    #[getter]
    fn gpu_energy<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.energy_dict(py)
    }

    /// GPU index to the bound of its energy (J): the true energy lies within ± the bound in
    /// about 95% of windows.
    #[getter]
    fn gpu_energy_uncertainty<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cached_dict(py, &mut self.bounds_dict, &self.bounds)
    }

    /// GPU index to how its energy was made (`Provenance`).
    #[getter]
    fn gpu_energy_provenance<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if let Some(d) = &self.provenance_dict {
            return Ok(d.bind(py).clone());
        }
        let d = PyDict::new(py);
        for (i, p) in &self.provenance {
            d.set_item(i, Py::new(py, p.clone())?)?;
        }
        self.provenance_dict = Some(d.clone().unbind());
        Ok(d)
    }

    #[getter]
    fn total_energy(&self, py: Python<'_>) -> PyResult<f64> {
        let gpu = match &self.dict {
            None => self.values.iter().map(|(_, e)| e).sum(),
            Some(_) => dict_sum(py, &self.dict)?,
        };
        Ok(gpu + dict_sum(py, &self.cpu_energy)? + dict_sum(py, &self.dram_energy)?)
    }

    /// The bounds of every energy added up (J): a bound of `total_energy`.
    #[getter]
    fn total_energy_uncertainty(&self, py: Python<'_>) -> PyResult<f64> {
        let gpu = match &self.bounds_dict {
            None => self.bounds.iter().map(|(_, e)| e).sum(),
            Some(_) => dict_sum(py, &self.bounds_dict)?,
        };
        Ok(gpu
            + dict_sum(py, &self.cpu_energy_uncertainty)?
            + dict_sum(py, &self.dram_energy_uncertainty)?)
    }

    fn __repr__(&mut self, py: Python<'_>) -> PyResult<String> {
        let d = self.energy_dict(py)?;
        let mut s = format!(
            "Measurement(time={}, energy={}",
            crate::monitor::counter::py_float(self.time),
            d.repr()?
        );
        if let Some(c) = &self.cpu_energy {
            s.push_str(&format!(", cpu_energy={}", c.bind(py).repr()?));
        }
        if let Some(m) = &self.dram_energy {
            s.push_str(&format!(", dram_energy={}", m.bind(py).repr()?));
        }
        let b = self.gpu_energy_uncertainty(py)?;
        if !b.is_empty() {
            s.push_str(&format!(", gpu_energy_uncertainty={}", b.repr()?));
        }
        s.push(')');
        Ok(s)
    }

    fn __eq__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Ok(other) = other.cast::<PyMeasurement>() else {
            return Ok(false);
        };
        if slf.is(other) {
            return Ok(true);
        }
        let py = slf.py();
        // Borrow one side at a time: both may be the same object behind different references.
        let side = |m: &Bound<'_, PyMeasurement>| -> PyResult<_> {
            let mut m = m.try_borrow_mut()?;
            let opt = |d: &Option<Py<PyDict>>| d.as_ref().map(|d| d.clone_ref(py).into_any());
            Ok((
                m.time,
                m.energy_dict(py)?,
                opt(&m.cpu_energy).into_pyobject(py)?.unbind(),
                opt(&m.dram_energy).into_pyobject(py)?.unbind(),
            ))
        };
        let (t1, d1, c1, m1) = side(slf)?;
        let (t2, d2, c2, m2) = side(other)?;
        Ok(t1 == t2 && d1.eq(d2)? && c1.bind(py).eq(c2)? && m1.bind(py).eq(m2)?)
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let mut m = slf.try_borrow_mut()?;
        let d = m.energy_dict(py)?;
        let b = m.gpu_energy_uncertainty(py)?;
        let p = m.gpu_energy_provenance(py)?;
        let opt = |d: &Option<Py<PyDict>>| -> PyResult<Bound<'py, PyAny>> {
            Ok(d.as_ref()
                .map(|d| d.clone_ref(py).into_bound(py).into_any())
                .into_pyobject(py)?
                .into_any())
        };
        let args = PyTuple::new(
            py,
            [
                m.time.into_pyobject(py)?.into_any(),
                d.into_any(),
                opt(&m.cpu_energy)?,
                opt(&m.dram_energy)?,
                b.into_any(),
                opt(&m.cpu_energy_uncertainty)?,
                opt(&m.dram_energy_uncertainty)?,
                p.into_any(),
            ],
        )?;
        Ok((slf.get_type().into_any(), args))
    }
}

fn make_measurement(py: Python<'_>, m: crate::monitor::Measurement) -> PyResult<Py<PyMeasurement>> {
    Py::new(
        py,
        PyMeasurement {
            time: m.time,
            values: m.energy,
            dict: None,
            cpu_energy: to_dict(py, m.cpu_energy)?,
            dram_energy: to_dict(py, m.dram_energy)?,
            bounds: m.energy_bound,
            bounds_dict: None,
            provenance: m
                .provenance
                .iter()
                .map(|(i, p)| (*i, PyProvenance::from(p)))
                .collect(),
            provenance_dict: None,
            cpu_energy_uncertainty: to_dict(py, m.cpu_bound)?,
            dram_energy_uncertainty: to_dict(py, m.dram_bound)?,
        },
    )
}

/// Power of GPUs sampled over time by a background thread, kept in a bounded timeline.
///
/// Args:
///     gpu_indices: GPUs to sample (framework indices); all visible GPUs if `None`.
///     update_period: Seconds between samples; `None` picks half the GPUs' power update period,
///         at most 0.1 s.
///     max_samples: Timeline length in samples (oldest dropped first); `None` keeps one hour.
///     background: Sample on a thread. `None` means yes, except on the simulator's virtual
///         clock, where nothing moves in real time and `sample_now()` drives sampling.
///     power_domains: Readings to sample: `"device_instant"` (NVML's instant power) and/or
///         `"device_average"` (`nvmlDeviceGetPowerUsage`, a trailing 1 s average on Ampere and
///         newer, which lags load steps). `None` samples `device_instant` where every GPU has
///         it, else `device_average`. The first is the default domain of queries.
///     gpu_update_period, max_samples_per_gpu, gpu_power_domains: Zeus 0.16's names for
///         `update_period`, `max_samples` and `power_domains` (keyword only).
///
/// Use it as a context manager or call `stop()`.
#[pyclass(name = "PowerMonitor", module = "zeus.monitor", frozen, subclass)]
pub(crate) struct PyPowerMonitor {
    inner: Arc<PowerMonitor>,
}

impl PyPowerMonitor {
    /// Sampling goes on through faults (the timeline has a gap, which the energy's bound
    /// counts); a device that has failed for `GONE_AFTER_S` is gone, and queries say so.
    fn check_thread(&self, py: Python<'_>) -> PyResult<()> {
        match self.inner.error() {
            Some((e, since))
                if self.inner.gpus().now() - since >= crate::monitor::energy::GONE_AFTER_S =>
            {
                Err(gpu_error(py, e))
            }
            _ => Ok(()),
        }
    }

    fn to_dict<'py>(
        &self,
        py: Python<'py>,
        v: Option<Vec<f64>>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(v) = v else { return Ok(None) };
        let d = PyDict::new(py);
        for (i, x) in self.inner.gpu_indices().iter().zip(v) {
            d.set_item(i, x)?;
        }
        Ok(Some(d))
    }
}

#[pymethods]
impl PyPowerMonitor {
    #[new]
    #[pyo3(signature = (
        gpu_indices = None,
        update_period = None,
        max_samples = None,
        background = None,
        power_domains = None,
        *,
        gpu_update_period = None,
        max_samples_per_gpu = None,
        gpu_power_domains = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        gpu_indices: Option<Vec<usize>>,
        update_period: Option<f64>,
        max_samples: Option<usize>,
        background: Option<bool>,
        power_domains: Option<Vec<String>>,
        gpu_update_period: Option<f64>,
        max_samples_per_gpu: Option<usize>,
        gpu_power_domains: Option<Vec<String>>,
    ) -> PyResult<Self> {
        // Zeus 0.16 spells three arguments differently; either spelling works, not both.
        fn either<T>(
            ours: Option<T>,
            theirs: Option<T>,
            names: (&str, &str),
        ) -> PyResult<Option<T>> {
            match (ours, theirs) {
                (Some(_), Some(_)) => Err(PyValueError::new_err(format!(
                    "give {} or {} (Zeus 0.16's name), not both",
                    names.0, names.1
                ))),
                (a, b) => Ok(a.or(b)),
            }
        }
        let update_period = either(
            update_period,
            gpu_update_period,
            ("update_period", "gpu_update_period"),
        )?;
        let max_samples = either(
            max_samples,
            max_samples_per_gpu,
            ("max_samples", "max_samples_per_gpu"),
        )?;
        let power_domains = either(
            power_domains,
            gpu_power_domains,
            ("power_domains", "gpu_power_domains"),
        )?;
        let gpus = core_gpus(&default_gpus(py)?)?;
        let domains = power_domains
            .map(|v| v.iter().map(|s| PowerDomain::parse(s)).collect())
            .transpose()
            .py_err(py)?;
        let opts = PowerMonitorOptions {
            update_period,
            max_samples,
            background,
            domains,
        };
        let inner = py
            .detach(|| PowerMonitor::new(gpus, gpu_indices, opts))
            .py_err(py)?;
        Ok(PyPowerMonitor {
            inner: Arc::new(inner),
        })
    }

    /// GPUs sampled, framework indices.
    #[getter]
    fn gpu_indices(&self) -> Vec<usize> {
        self.inner.gpu_indices().to_vec()
    }

    /// Seconds between samples.
    #[getter]
    fn update_period(&self) -> f64 {
        self.inner.update_period()
    }

    /// Whether the sampling thread is running.
    #[getter]
    fn running(&self) -> bool {
        self.inner.is_running()
    }

    /// Number of samples in the timeline.
    #[getter]
    fn num_samples(&self) -> usize {
        self.inner.num_samples()
    }

    /// Timeline capacity in samples.
    #[getter]
    fn max_samples(&self) -> usize {
        self.inner.with_timeline(|t| t.capacity())
    }

    /// Bytes of storage per sample per GPU.
    #[getter]
    fn bytes_per_sample(&self) -> f64 {
        self.inner.with_timeline(|t| t.bytes_per_sample_per_gpu())
    }

    /// Bytes currently allocated for samples.
    #[getter]
    fn allocated_bytes(&self) -> usize {
        self.inner.with_timeline(|t| t.allocated_bytes())
    }

    /// Take one sample now. Returns `False` if the clock has not moved since the last sample.
    /// On the virtual clock this is how samples are taken: advance the clock, then sample.
    fn sample_now(&self, py: Python<'_>) -> PyResult<bool> {
        let inner = &self.inner;
        py.detach(|| inner.sample_now())
            .map_err(|e| gpu_error(py, e))
    }

    /// Stop the sampling thread. Samples taken so far stay readable. Idempotent.
    fn stop(&self, py: Python<'_>) {
        let inner = &self.inner;
        py.detach(|| inner.stop());
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.stop(py);
        false
    }

    /// Sampled power domains; the first is the default of queries.
    #[getter]
    fn power_domains(&self) -> Vec<&'static str> {
        self.inner.domains().iter().map(|d| d.name()).collect()
    }

    /// Energy in joules per GPU over `[start_time, end_time]` (trapezoidal rule over the
    /// timeline, the window edges interpolated), or `None` with fewer than two points.
    /// `power_domain` picks the timeline (default: the first of `power_domains`).
    #[pyo3(signature = (start_time, end_time, power_domain = None))]
    fn get_energy<'py>(
        &self,
        py: Python<'py>,
        start_time: f64,
        end_time: f64,
        power_domain: Option<&str>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.check_thread(py)?;
        let d = parse_domain(py, power_domain)?;
        let v = self
            .inner
            .get_energy_in(d, start_time, end_time)
            .py_err(py)?;
        self.to_dict(py, v)
    }

    /// The bound (J) per GPU of `get_energy` over the same window: the true energy lies within
    /// ± the bound in about 95% of windows. It counts how far the power may have moved between
    /// samples, gaps in the timeline (a driver fault), the readings' lag behind their
    /// timestamps, and 1% for their noise. `None` where `get_energy` is `None`.
    #[pyo3(signature = (start_time, end_time, power_domain = None))]
    fn get_energy_uncertainty<'py>(
        &self,
        py: Python<'py>,
        start_time: f64,
        end_time: f64,
        power_domain: Option<&str>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.check_thread(py)?;
        let d = parse_domain(py, power_domain)?;
        let v = self
            .inner
            .get_energy_bound_in(d, start_time, end_time)
            .py_err(py)?;
        self.to_dict(py, v)
    }

    /// The error the latest samples failed with, while they fail (sampling goes on, leaving a
    /// gap that `get_energy_uncertainty` counts), else `None`.
    #[getter]
    fn error(&self) -> Option<String> {
        self.inner.error().map(|(e, _)| e.to_string())
    }

    /// Power in watts per GPU: the latest sample if `time` is `None`, else the first sample at
    /// or after `time` (the latest if none). `None` if nothing was sampled yet.
    #[pyo3(signature = (time = None, power_domain = None))]
    fn get_power<'py>(
        &self,
        py: Python<'py>,
        time: Option<f64>,
        power_domain: Option<&str>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.check_thread(py)?;
        let d = parse_domain(py, power_domain)?;
        let v = self.inner.get_power_in(d, time).py_err(py)?;
        self.to_dict(py, v)
    }

    /// Zeus 0.16's timeline export: `{gpu_index: [(timestamp, watts), ...]}` of one domain
    /// (default: the first of `power_domains`), for one GPU or all, samples within
    /// `[start_time, end_time]` where given.
    #[pyo3(signature = (gpu_power_domain = None, gpu_index = None, start_time = None, end_time = None))]
    fn get_power_timeline<'py>(
        &self,
        py: Python<'py>,
        gpu_power_domain: Option<&str>,
        gpu_index: Option<usize>,
        start_time: Option<f64>,
        end_time: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let dom = parse_domain(py, gpu_power_domain)?;
        let indices = self.inner.gpu_indices();
        let columns: Vec<usize> = match gpu_index {
            None => (0..indices.len()).collect(),
            Some(i) => vec![indices.iter().position(|&j| j == i).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "GPU {i} is not monitored (gpu_indices: {indices:?})"
                ))
            })?],
        };
        let (lo, hi) = (
            start_time.unwrap_or(f64::NEG_INFINITY),
            end_time.unwrap_or(f64::INFINITY),
        );
        let series = self
            .inner
            .with_timeline_in(dom, |tl| {
                columns
                    .iter()
                    .map(|&g| {
                        (0..tl.len())
                            .filter(|&k| (lo..=hi).contains(&tl.time(k)))
                            .map(|k| (tl.time(k), f64::from(tl.power_mw(k, g)) / 1000.0))
                            .collect::<Vec<(f64, f64)>>()
                    })
                    .collect::<Vec<_>>()
            })
            .py_err(py)?;
        let d = PyDict::new(py);
        for (g, points) in columns.iter().zip(series) {
            d.set_item(indices[*g], points)?;
        }
        Ok(d)
    }

    /// Every sampled domain's timeline: `{domain: {gpu_index: [(timestamp, watts), ...]}}`.
    #[pyo3(signature = (gpu_index = None, start_time = None, end_time = None))]
    fn get_all_power_timelines<'py>(
        &self,
        py: Python<'py>,
        gpu_index: Option<usize>,
        start_time: Option<f64>,
        end_time: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for dom in self.inner.domains() {
            let t =
                self.get_power_timeline(py, Some(dom.name()), gpu_index, start_time, end_time)?;
            d.set_item(dom.name(), t)?;
        }
        Ok(d)
    }

    /// The whole timeline of `power_domain` (default: the first):
    /// `(timestamps, {gpu_index: [watts, ...]})`, oldest first.
    #[pyo3(signature = (power_domain = None))]
    fn timeline<'py>(
        &self,
        py: Python<'py>,
        power_domain: Option<&str>,
    ) -> PyResult<(Vec<f64>, Bound<'py, PyDict>)> {
        let dom = parse_domain(py, power_domain)?;
        let (t, cols) = self
            .inner
            .with_timeline_in(dom, |tl| tl.to_columns())
            .py_err(py)?;
        let d = PyDict::new(py);
        for (i, c) in self.inner.gpu_indices().iter().zip(cols) {
            d.set_item(i, c)?;
        }
        Ok((t, d))
    }

    fn __repr__(&self) -> String {
        format!(
            "PowerMonitor(gpu_indices={:?}, update_period={}, running={})",
            self.inner.gpu_indices(),
            crate::monitor::counter::py_float(self.inner.update_period()),
            if self.inner.is_running() {
                "True"
            } else {
                "False"
            }
        )
    }
}

fn parse_domain(py: Python<'_>, d: Option<&str>) -> PyResult<Option<PowerDomain>> {
    d.map(PowerDomain::parse).transpose().py_err(py)
}

/// GPU temperature over time, sampled by the process's shared sampler thread (no thread or
/// process of its own). Zeus 0.16's `TemperatureMonitor`.
///
/// Args:
///     gpu_indices: GPUs to watch (framework indices); all visible GPUs if `None`.
///     update_period: Seconds between samples (default 1.0).
///     max_samples_per_gpu: Samples kept per GPU, oldest dropped first; `None` keeps an hour.
///
/// Needs the real clock (the sampler runs in real time). Use it as a context manager or call
/// `stop()`; samples taken stay readable after.
#[pyclass(name = "TemperatureMonitor", module = "zeus.monitor", frozen)]
pub(crate) struct PyTemperatureMonitor {
    indices: Vec<usize>,
    period: f64,
    watched: Vec<Arc<crate::monitor::sampler::Watched>>,
    lease: Mutex<Option<crate::monitor::sampler::Lease>>,
}

impl PyTemperatureMonitor {
    fn column(&self, gpu_index: usize) -> PyResult<usize> {
        self.indices
            .iter()
            .position(|&i| i == gpu_index)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "GPU {gpu_index} is not monitored (gpu_indices: {:?})",
                    self.indices
                ))
            })
    }

    fn check(&self) -> PyResult<()> {
        for (i, w) in self.indices.iter().zip(&self.watched) {
            if let Some(e) = w.temperature_error() {
                return Err(PyRuntimeError::new_err(format!(
                    "temperature sampling of GPU {i} stopped: {e}"
                )));
            }
        }
        Ok(())
    }
}

#[pymethods]
impl PyTemperatureMonitor {
    #[new]
    #[pyo3(signature = (gpu_indices = None, update_period = 1.0, max_samples_per_gpu = None))]
    fn new(
        py: Python<'_>,
        gpu_indices: Option<Vec<usize>>,
        update_period: f64,
        max_samples_per_gpu: Option<usize>,
    ) -> PyResult<Self> {
        use crate::monitor::sampler::{Interest, Sampler};
        let gpus = core_gpus(&default_gpus(py)?)?;
        if gpus.clock().is_virtual() {
            return Err(PyValueError::new_err(
                "TemperatureMonitor needs the real clock: the sampler runs in real time",
            ));
        }
        if !(update_period.is_finite() && update_period >= crate::monitor::power::MIN_PERIOD) {
            return Err(PyValueError::new_err(format!(
                "update_period must be at least {} s, got {update_period}",
                crate::monitor::power::MIN_PERIOD
            )));
        }
        let capacity = match max_samples_per_gpu {
            Some(0) => {
                return Err(PyValueError::new_err(
                    "max_samples_per_gpu must be at least 1, got 0",
                ))
            }
            Some(n) => n,
            None => ((3600.0 / update_period).ceil() as usize).clamp(2, 1 << 20),
        };
        let indices = gpu_indices.unwrap_or_else(|| (0..gpus.len()).collect());
        crate::monitor::power::check_indices(&gpus, &indices).py_err(py)?;
        let devices = indices
            .iter()
            .map(|&i| gpus.device(i).cloned())
            .collect::<crate::device::GpuResult<Vec<_>>>()
            .map_err(|e| gpu_error(py, e))?;
        // A GPU without a temperature sensor fails here, with its own error class.
        for d in &devices {
            d.temperature_c().map_err(|e| gpu_error(py, e))?;
        }
        let interest = Interest::Temperature {
            period: update_period,
            capacity,
        };
        let lease = py
            .detach(|| Sampler::lease_for(&devices, interest))
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let watched = (0..lease.len()).map(|k| lease.watched(k).clone()).collect();
        Ok(PyTemperatureMonitor {
            indices,
            period: update_period,
            watched,
            lease: Mutex::new(Some(lease)),
        })
    }

    #[getter]
    fn gpu_indices(&self) -> Vec<usize> {
        self.indices.clone()
    }

    #[getter]
    fn update_period(&self) -> f64 {
        self.period
    }

    /// `{gpu_index: [(timestamp, °C), ...]}`, oldest first, within `[start_time, end_time]`
    /// where given.
    #[pyo3(signature = (gpu_index = None, start_time = None, end_time = None))]
    fn get_temperature_timeline<'py>(
        &self,
        py: Python<'py>,
        gpu_index: Option<usize>,
        start_time: Option<f64>,
        end_time: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        self.check()?;
        let columns = match gpu_index {
            None => (0..self.indices.len()).collect(),
            Some(i) => vec![self.column(i)?],
        };
        let (lo, hi) = (
            start_time.unwrap_or(f64::NEG_INFINITY),
            end_time.unwrap_or(f64::INFINITY),
        );
        let d = PyDict::new(py);
        for k in columns {
            d.set_item(self.indices[k], self.watched[k].temperatures(lo, hi))?;
        }
        Ok(d)
    }

    /// `{gpu_index: °C}`: the latest sample, or the latest at or before `time`; `None` if a GPU
    /// has no such sample yet.
    #[pyo3(signature = (time = None))]
    fn get_temperature<'py>(
        &self,
        py: Python<'py>,
        time: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.check()?;
        let d = PyDict::new(py);
        for (i, w) in self.indices.iter().zip(&self.watched) {
            let Some((_, c)) = w.temperature_at(time) else {
                return Ok(None);
            };
            d.set_item(i, c)?;
        }
        Ok(Some(d))
    }

    /// Stop sampling (idempotent); samples taken stay readable.
    fn stop(&self, py: Python<'_>) {
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(move || drop(lease));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.stop(py);
        false
    }
}

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
#[pyclass(name = "ZeusMonitor", module = "zeus._core", frozen, subclass)]
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

    /// Open measurement window `key` (see `zeus.monitor.ZeusMonitor`).
    #[pyo3(signature = (key, sync_cuda = None, *, sync_execution = None))]
    fn begin_window(
        &self,
        py: Python<'_>,
        key: PyBackedStr,
        sync_cuda: Option<bool>,
        sync_execution: Option<bool>,
    ) -> PyResult<()> {
        let st = self.state()?;
        if sync_flag(sync_cuda, sync_execution)? {
            sync_all(py, st)?;
        }
        // The GIL is kept: the reads take a microsecond or so, and releasing and retaking it
        // would cost a good share of that (the mutex is never awaited without the GIL held,
        // so this cannot deadlock).
        lock(&st.core).begin_window(&key).py_err(py)
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
            let r = (|| -> crate::device::GpuResult<InstantPower> {
                let t0 = st.gpus.now();
                let mut watts = Vec::with_capacity(st.indices.len());
                for &i in &st.indices {
                    watts.push(st.gpus.device(i)?.average_power_usage()? as f64 / 1000.0);
                }
                Ok(InstantPower {
                    watts,
                    read_time: st.gpus.now() - t0,
                })
            })();
            Some(r.map_err(|e| gpu_error(py, e))?)
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

    /// Turn off (or on) the warning for windows shorter than the counter's update period, for
    /// monitors whose windows are cut at boundaries of a program's own (`zeus.monitor.carbon`).
    fn _set_short_window_warnings(&self, on: bool) -> PyResult<()> {
        lock(&self.state()?.core).set_short_window_warnings(on);
        Ok(())
    }

    /// Open windows: `{key: (start_time, {gpu_index: start_energy_J})}` for GPUs with an
    /// energy counter (the reference's `measurement_states`).
    #[getter]
    fn measurement_states<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.state()?;
        let open = lock(&st.core).open_windows();
        let d = PyDict::new(py);
        for (k, t, e) in open {
            let ed = PyDict::new(py);
            for (i, j) in e {
                ed.set_item(i, j)?;
            }
            d.set_item(k, (t, ed))?;
        }
        Ok(d)
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
fn infer_counter_update_period(py: Python<'_>, gpu_indices: Vec<usize>) -> PyResult<f64> {
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
fn stop_sampler(py: Python<'_>) {
    py.detach(crate::monitor::sampler::Sampler::stop_current);
}

mod power_log;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    power_log::register(m)?;
    m.add_function(wrap_pyfunction!(infer_counter_update_period, m)?)?;
    m.add_function(wrap_pyfunction!(stop_sampler, m)?)?;
    m.add_class::<PyMeasurement>()?;
    m.add_class::<PyProvenance>()?;
    m.add_class::<PyPowerMonitor>()?;
    m.add_class::<PyZeusMonitor>()?;
    m.add_class::<PyTemperatureMonitor>()?;
    Ok(())
}
