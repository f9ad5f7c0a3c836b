//! `PowerMonitor`: power sampled over time into a bounded timeline.

use super::*;

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
    pub(super) inner: Arc<PowerMonitor>,
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
    /// `power_domain` is Zeus 0.16.0's name of `gpu_power_domain` (its master's).
    #[pyo3(signature = (gpu_power_domain = None, gpu_index = None, start_time = None, end_time = None, *, power_domain = None))]
    fn get_power_timeline<'py>(
        &self,
        py: Python<'py>,
        gpu_power_domain: Option<&str>,
        gpu_index: Option<usize>,
        start_time: Option<f64>,
        end_time: Option<f64>,
        power_domain: Option<&str>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if gpu_power_domain.is_some() && power_domain.is_some() && gpu_power_domain != power_domain
        {
            return Err(PyValueError::new_err(format!(
                "gpu_power_domain={gpu_power_domain:?} and power_domain={power_domain:?} disagree; \
                 give one (they are two names of the same argument)"
            )));
        }
        let dom = parse_domain(py, gpu_power_domain.or(power_domain))?;
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
            let t = self.get_power_timeline(
                py,
                Some(dom.name()),
                gpu_index,
                start_time,
                end_time,
                None,
            )?;
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
