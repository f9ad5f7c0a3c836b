//! `zeus._core.GPUs`: the visible GPUs, with the reference's newer method names (GPU index
//! first). Every device call releases the GIL.

use pyo3::prelude::*;

pub(crate) mod cpu;
pub(crate) mod settings;

use super::errors::{gpu_error, IntoPyResult};
use crate::device::{Gpu, GpuResult, Gpus};

#[pyclass(name = "GPUs", module = "zeus._core.device", subclass, frozen)]
pub(crate) struct PyGpus {
    pub(crate) inner: Gpus,
}

impl PyGpus {
    /// Run `f` on device `index` with the GIL released.
    fn with_device<T: Send>(
        &self,
        py: Python<'_>,
        index: usize,
        f: impl FnOnce(&dyn Gpu) -> GpuResult<T> + Send,
    ) -> PyResult<T> {
        let dev = self.inner.device(index).py_err(py)?.clone();
        py.detach(move || f(dev.as_ref())).py_err(py)
    }

    /// A device write. With `block`, wait for it and raise its error; without, check the index,
    /// hand the call to a thread and return at once (zeusd's `block=false`: dispatched, errors
    /// not reported), for callers that must not wait on a slow driver call.
    fn write(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        block: bool,
        f: impl FnOnce(&Gpus, usize) -> GpuResult<()> + Send + 'static,
    ) -> PyResult<()> {
        self.inner.device(gpu_index).py_err(py)?;
        let gpus = self.inner.clone();
        if block {
            py.detach(move || f(&gpus, gpu_index)).py_err(py)
        } else {
            std::thread::spawn(move || f(&gpus, gpu_index));
            Ok(())
        }
    }
}

#[pymethods]
impl PyGpus {
    /// Open the backend chosen by `ZEUS_GPU_BACKEND` and apply `CUDA_VISIBLE_DEVICES`.
    #[new]
    #[pyo3(signature = (ensure_homogeneous = false))]
    fn new(py: Python<'_>, ensure_homogeneous: bool) -> PyResult<Self> {
        let inner = py
            .detach(|| {
                let g = Gpus::from_env()?;
                if ensure_homogeneous {
                    g.ensure_homogeneous()?;
                }
                Ok(g)
            })
            .py_err(py)?;
        Ok(PyGpus { inner })
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// `"nvml"`, `"amd"` or `"sim"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend().name()
    }

    /// Warnings from opening the GPUs (an AMD energy counter disabled at the start check,
    /// and why).
    #[getter]
    fn notes(&self) -> Vec<String> {
        self.inner.notes().to_vec()
    }

    /// `"nvidia"` or `"amd"`.
    fn get_vendor(&self, py: Python<'_>, gpu_index: usize) -> PyResult<&'static str> {
        self.inner
            .device(gpu_index)
            .map(|d| d.vendor().name())
            .py_err(py)
    }

    /// Backend (NVML) index of each visible GPU, in framework order.
    #[getter]
    fn physical_indices(&self) -> Vec<usize> {
        self.inner.physical_indices().to_vec()
    }

    /// Seconds since the epoch on the backend's clock (the simulator's may be virtual).
    fn now(&self) -> f64 {
        self.inner.now()
    }

    /// Whether the backend's clock is virtual.
    #[getter]
    fn virtual_clock(&self) -> bool {
        self.inner.clock().is_virtual()
    }

    fn ensure_homogeneous(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.ensure_homogeneous()).py_err(py)
    }

    fn get_name(&self, py: Python<'_>, gpu_index: usize) -> PyResult<String> {
        self.with_device(py, gpu_index, |d| d.name())
    }

    fn get_uuid(&self, py: Python<'_>, gpu_index: usize) -> PyResult<String> {
        self.with_device(py, gpu_index, |d| d.uuid())
    }

    /// Lower-case architecture name, e.g. `"volta"`.
    fn get_architecture(&self, py: Python<'_>, gpu_index: usize) -> PyResult<&'static str> {
        self.with_device(py, gpu_index, |d| d.architecture().map(|a| a.name()))
    }

    /// `(min, max)` power limit in mW.
    fn get_power_management_limit_constraints(
        &self,
        py: Python<'_>,
        gpu_index: usize,
    ) -> PyResult<(u32, u32)> {
        self.with_device(py, gpu_index, |d| d.power_management_limit_constraints())
    }

    fn get_default_power_management_limit(
        &self,
        py: Python<'_>,
        gpu_index: usize,
    ) -> PyResult<u32> {
        self.with_device(py, gpu_index, |d| d.power_management_limit_default())
    }

    fn get_power_management_limit(&self, py: Python<'_>, gpu_index: usize) -> PyResult<u32> {
        self.with_device(py, gpu_index, |d| d.power_management_limit())
    }

    #[pyo3(signature = (gpu_index, power_limit_mw, block = true))]
    fn set_power_management_limit(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        power_limit_mw: u32,
        block: bool,
    ) -> PyResult<()> {
        self.write(py, gpu_index, block, move |g, i| {
            g.set_power_management_limit(i, power_limit_mw)
        })
    }

    #[pyo3(signature = (gpu_index, block = true))]
    fn reset_power_management_limit(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        block: bool,
    ) -> PyResult<()> {
        self.write(py, gpu_index, block, |g, i| {
            g.device(i)?.reset_power_management_limit()
        })
    }

    fn get_persistence_mode(&self, py: Python<'_>, gpu_index: usize) -> PyResult<bool> {
        self.with_device(py, gpu_index, |d| d.persistence_mode())
    }

    #[pyo3(signature = (gpu_index, enabled, block = true))]
    fn set_persistence_mode(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        enabled: bool,
        block: bool,
    ) -> PyResult<()> {
        self.write(py, gpu_index, block, move |g, i| {
            g.device(i)?.set_persistence_mode(enabled)
        })
    }

    fn get_supported_memory_clocks(&self, py: Python<'_>, gpu_index: usize) -> PyResult<Vec<u32>> {
        self.with_device(py, gpu_index, |d| d.supported_memory_clocks())
    }

    #[pyo3(signature = (gpu_index, memory_clock_mhz = None))]
    fn get_supported_graphics_clocks(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        memory_clock_mhz: Option<u32>,
    ) -> PyResult<Vec<u32>> {
        self.with_device(py, gpu_index, |d| {
            let mem = match memory_clock_mhz {
                Some(m) => m,
                None => d.supported_memory_clocks()?.into_iter().max().unwrap_or(0),
            };
            d.supported_graphics_clocks(mem)
        })
    }

    #[pyo3(signature = (gpu_index, min_clock_mhz, max_clock_mhz, block = true))]
    fn set_gpu_locked_clocks(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        min_clock_mhz: u32,
        max_clock_mhz: u32,
        block: bool,
    ) -> PyResult<()> {
        self.write(py, gpu_index, block, move |g, i| {
            g.set_gpu_locked_clocks(i, min_clock_mhz, max_clock_mhz)
        })
    }

    #[pyo3(signature = (gpu_index, block = true))]
    fn reset_gpu_locked_clocks(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        block: bool,
    ) -> PyResult<()> {
        self.write(py, gpu_index, block, |g, i| {
            g.device(i)?.reset_gpu_locked_clocks()
        })
    }

    #[pyo3(signature = (gpu_index, min_clock_mhz, max_clock_mhz, block = true))]
    fn set_memory_locked_clocks(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        min_clock_mhz: u32,
        max_clock_mhz: u32,
        block: bool,
    ) -> PyResult<()> {
        self.write(py, gpu_index, block, move |g, i| {
            g.set_memory_locked_clocks(i, min_clock_mhz, max_clock_mhz)
        })
    }

    #[pyo3(signature = (gpu_index, block = true))]
    fn reset_memory_locked_clocks(
        &self,
        py: Python<'_>,
        gpu_index: usize,
        block: bool,
    ) -> PyResult<()> {
        self.write(py, gpu_index, block, |g, i| {
            g.device(i)?.reset_memory_locked_clocks()
        })
    }

    /// Driver-averaged power, mW.
    fn get_average_power_usage(&self, py: Python<'_>, gpu_index: usize) -> PyResult<u32> {
        self.with_device(py, gpu_index, |d| d.average_power_usage())
    }

    /// The board's power, mW: the driver's average where it has one, else its instant power
    /// (an MI300X has no average, an MI250X no instant power).
    fn get_power_usage(&self, py: Python<'_>, gpu_index: usize) -> PyResult<u32> {
        self.with_device(py, gpu_index, |d| {
            crate::device::power_mw(d, crate::device::PowerPreference::Average)
        })
    }

    /// Instantaneous power, mW (`ZeusGPUNotSupportedError` where the device lacks it).
    fn get_instant_power_usage(&self, py: Python<'_>, gpu_index: usize) -> PyResult<u32> {
        self.with_device(py, gpu_index, |d| d.instant_power_usage())
    }

    fn supports_get_total_energy_consumption(
        &self,
        py: Python<'_>,
        gpu_index: usize,
    ) -> PyResult<bool> {
        self.with_device(py, gpu_index, |d| d.supports_total_energy_consumption())
    }

    /// Energy since the driver loaded, mJ.
    fn get_total_energy_consumption(&self, py: Python<'_>, gpu_index: usize) -> PyResult<u64> {
        self.with_device(py, gpu_index, |d| d.total_energy_consumption())
    }

    /// GPU core temperature, °C (Zeus 0.16's name).
    fn get_gpu_temperature(&self, py: Python<'_>, gpu_index: usize) -> PyResult<u32> {
        self.with_device(py, gpu_index, |d| d.temperature_c())
    }

    /// How often the driver refreshes its power readings, seconds: the backend's figure where it
    /// has one (the simulator), else measured by watching the reading change (up to 0.6 s; NVML
    /// does not say). `None` when the reading did not change in that time, or on a virtual clock.
    fn get_power_update_period(&self, py: Python<'_>, gpu_index: usize) -> PyResult<Option<f64>> {
        let gpus = &self.inner;
        py.detach(|| crate::monitor::power::detect_update_period(gpus, gpu_index))
            .map_err(|e| gpu_error(py, e))
    }

    fn __repr__(&self) -> String {
        format!(
            "GPUs(backend={:?}, count={}, physical_indices={:?})",
            self.inner.backend().name(),
            self.inner.len(),
            self.inner.physical_indices()
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGpus>()?;
    cpu::register(m)
}
