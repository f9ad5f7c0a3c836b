//! `zeus._core.CPUs`: the CPU packages measured through RAPL (`zeus.device.cpu`). Reads take
//! microseconds (one sysfs file each), so the GIL is kept.

use pyo3::prelude::*;

use crate::device::cpu::{CpuResult, Cpus};
use crate::python::errors::cpu_error;

pub(crate) trait IntoCpuResult<T> {
    fn cpu_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoCpuResult<T> for CpuResult<T> {
    fn cpu_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| cpu_error(py, e))
    }
}

#[pyclass(name = "CPUs", module = "zeus._core.device", subclass, frozen)]
pub(crate) struct PyCpus {
    pub(crate) inner: Cpus,
}

#[pymethods]
impl PyCpus {
    /// Open the process-wide CPU packages: the simulated ones with `ZEUS_SIM_CPUS=N`, else the
    /// RAPL zones under `ZEUS_RAPL_ROOT` or `/sys/class/powercap`.
    #[new]
    fn new(py: Python<'_>) -> PyResult<Self> {
        let inner = py.detach(Cpus::from_env).cpu_err(py)?;
        Ok(PyCpus { inner })
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// `"RAPL"` or `"Simulated RAPL"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend_name()
    }

    /// The powercap root the packages were found under.
    #[getter]
    fn root(&self) -> String {
        self.inner.root().display().to_string()
    }

    /// `(package_mj, dram_mj or None)`: cumulative, unwrapped energy of package `index`, read now.
    fn _total_energy_mj(&self, py: Python<'_>, index: usize) -> PyResult<(f64, Option<f64>)> {
        let p = self.inner.package(index).cpu_err(py)?;
        let cpu = p.package.energy_j().cpu_err(py)? * 1000.0;
        let dram = p
            .dram
            .as_ref()
            .map(|d| d.energy_j().map(|j| j * 1000.0))
            .transpose()
            .cpu_err(py)?;
        Ok((cpu, dram))
    }

    /// Whether package `index` has a DRAM zone.
    fn supports_get_dram_energy_consumption(&self, py: Python<'_>, index: usize) -> PyResult<bool> {
        Ok(self.inner.package(index).cpu_err(py)?.dram.is_some())
    }

    /// The `energy_uj` files of package `index`: `(package, dram or None)`.
    fn energy_files(&self, py: Python<'_>, index: usize) -> PyResult<(String, Option<String>)> {
        let p = self.inner.package(index).cpu_err(py)?;
        Ok((
            p.package.energy_path().display().to_string(),
            p.dram
                .as_ref()
                .map(|d| d.energy_path().display().to_string()),
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "CPUs(backend={:?}, packages={}, root={:?})",
            self.inner.backend_name(),
            self.inner.len(),
            self.inner.root().display().to_string()
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCpus>()
}
