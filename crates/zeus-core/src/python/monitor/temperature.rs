//! `TemperatureMonitor`: GPU temperature over time, from the shared sampler thread.

use super::*;

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
    inner: crate::monitor::TemperatureMonitor,
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
        let gpus = core_gpus(&default_gpus(py)?)?;
        let inner = py
            .detach(|| {
                crate::monitor::TemperatureMonitor::new(
                    &gpus,
                    gpu_indices,
                    update_period,
                    max_samples_per_gpu,
                )
            })
            .py_err(py)?;
        Ok(PyTemperatureMonitor { inner })
    }

    #[getter]
    fn gpu_indices(&self) -> Vec<usize> {
        self.inner.gpu_indices().to_vec()
    }

    #[getter]
    fn update_period(&self) -> f64 {
        self.inner.update_period()
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
        let columns = self
            .inner
            .timeline(
                gpu_index,
                start_time.unwrap_or(f64::NEG_INFINITY),
                end_time.unwrap_or(f64::INFINITY),
            )
            .py_err(py)?;
        let d = PyDict::new(py);
        for (i, samples) in columns {
            d.set_item(i, samples)?;
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
        let Some(latest) = self.inner.latest(time).py_err(py)? else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (i, c) in latest {
            d.set_item(i, c)?;
        }
        Ok(Some(d))
    }

    /// Stop sampling (idempotent); samples taken stay readable.
    fn stop(&self, py: Python<'_>) {
        py.detach(|| self.inner.stop());
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
