//! `zeus._core` classes that drive the in-process simulated devices (`zeus.device.sim`):
//! `SimCluster` (the process's simulated GPUs and their clock), `SimGpu` (one of them) and
//! `SimCpus` (the simulated RAPL packages).

use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::device::cpu::IntoCpuResult;
use super::errors::IntoPyResult;
use crate::device::cpu::sim::SimRapl;
use crate::device::sim::{self, board, CurvePoint, Load, WorkloadCurve};
use crate::device::Clock;

/// The simulated GPUs of this process (from `ZEUS_SIM_GPUS`) and their clock.
#[pyclass(name = "SimCluster", module = "zeus._core.sim", frozen)]
pub(crate) struct PySimCluster {
    inner: Arc<sim::SimCluster>,
}

#[pymethods]
impl PySimCluster {
    /// The process's simulated cluster, built from the environment on first use.
    #[staticmethod]
    fn current(py: Python<'_>) -> PyResult<Self> {
        Ok(PySimCluster {
            inner: sim::global_cluster().py_err(py)?,
        })
    }

    /// Forget the process's cluster; the next `current()` rebuilds it from the environment.
    #[staticmethod]
    fn reset() {
        sim::reset_global_cluster();
    }

    /// Every model the simulator knows.
    #[staticmethod]
    fn known_presets() -> Vec<&'static str> {
        sim::preset::keys()
    }

    fn __len__(&self) -> usize {
        self.inner.devices().len()
    }

    /// Preset key (model) of each simulated GPU.
    #[getter]
    fn presets(&self) -> Vec<&'static str> {
        self.inner
            .devices()
            .iter()
            .map(|d| d.preset().key)
            .collect()
    }

    /// Whether the cluster runs on a virtual clock.
    #[getter]
    fn is_virtual_clock(&self) -> bool {
        self.inner.clock().is_virtual()
    }

    /// Simulator time, seconds since the epoch.
    fn now(&self) -> f64 {
        self.inner.clock().now()
    }

    /// Advance the virtual clock by `seconds`.
    fn advance(&self, seconds: f64) -> PyResult<()> {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(PyValueError::new_err(format!(
                "seconds must be a finite number >= 0, got {seconds}"
            )));
        }
        if !self.inner.clock().advance(seconds) {
            return Err(PyRuntimeError::new_err(
                "the simulated GPU runs on the real clock; set ZEUS_SIM_CLOCK=virtual to advance time",
            ));
        }
        Ok(())
    }

    /// Start `work` units on the given GPUs; returns the seconds the slowest needs. The
    /// virtual clock is advanced by that much; on the real clock the caller waits.
    fn run(&self, py: Python<'_>, indices: Vec<usize>, work: f64) -> PyResult<f64> {
        if !(work.is_finite() && work >= 0.0) {
            return Err(PyValueError::new_err(format!(
                "work must be a finite number >= 0, got {work}"
            )));
        }
        self.inner.run(&indices, work).py_err(py)
    }

    /// Simulated GPU `index` (the simulator's own index, before `CUDA_VISIBLE_DEVICES`).
    fn gpu(&self, py: Python<'_>, index: usize) -> PyResult<PySimGpu> {
        Ok(PySimGpu {
            gpu: Arc::clone(self.inner.device(index).py_err(py)?),
            cluster: Arc::clone(&self.inner),
        })
    }
}

/// One simulated GPU.
#[pyclass(name = "SimGpu", module = "zeus._core.sim", frozen)]
pub(crate) struct PySimGpu {
    gpu: Arc<sim::SimGpu>,
    cluster: Arc<sim::SimCluster>,
}

#[pymethods]
impl PySimGpu {
    /// Mark the GPU busy (drawing its workload's power) or idle.
    fn set_busy(&self, busy: bool) {
        self.gpu
            .set_load(if busy { Load::Busy } else { Load::Idle });
    }

    /// Make the GPU draw `watts` from now on, whatever its workload (clamped to its power
    /// limit), until its load changes. `ValueError` for a negative or non-finite `watts`.
    fn set_power(&self, watts: f64) -> PyResult<()> {
        // A bad argument to a simulator control, as for `advance` and `inject_fault`: not a
        // driver's error.
        self.gpu
            .set_power_draw(watts)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Whether the GPU is busy now (a set power draw is busy above the board's idle power).
    #[getter]
    fn is_busy(&self) -> bool {
        self.gpu.is_busy()
    }

    /// Replace the workload curve with `(power_limit W, time_per_epoch s, average_power W)`
    /// points.
    fn set_workload_points(&self, py: Python<'_>, points: Vec<(f64, f64, f64)>) -> PyResult<()> {
        let points = points
            .into_iter()
            .map(|(pl, t, p)| CurvePoint {
                power_limit_w: pl,
                time_per_epoch_s: t,
                average_power_w: p,
            })
            .collect();
        let curve = WorkloadCurve::new(points).map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.gpu.set_curve(curve).py_err(py)
    }

    /// Replace the workload curve with one read from a CSV file.
    fn set_workload_csv(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let curve =
            WorkloadCurve::from_csv(&path).map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.gpu.set_curve(curve).py_err(py)
    }

    /// The workload curve as `(power_limit, time_per_epoch, average_power)` points.
    fn workload_points(&self) -> Vec<(f64, f64, f64)> {
        self.gpu
            .curve()
            .points()
            .iter()
            .map(|p| (p.power_limit_w, p.time_per_epoch_s, p.average_power_w))
            .collect()
    }

    /// `(seconds per unit of work, watts)` when busy at the GPU's current settings.
    fn steady_state(&self) -> (f64, f64) {
        self.gpu.busy_steady_state()
    }

    /// The model's exact energy so far, J (ground truth for tests; no counter rounding), or up
    /// to the moment `at` (the clock's seconds) where the device still remembers it.
    #[pyo3(signature = (at = None))]
    fn true_energy(&self, at: Option<f64>) -> f64 {
        match at {
            Some(t) => self.gpu.true_energy_at(t),
            None => self.gpu.true_energy_j(),
        }
    }

    /// The model's power right now, W, without reading noise.
    fn true_power(&self) -> f64 {
        self.gpu.true_power_w()
    }

    /// Make the calls `calls` (`energy`, `power`, `other`, `write`, joined by `+`, or `all`)
    /// fail with NVML error `error` (a name such as `GPU_IS_LOST`) for `seconds` (infinite:
    /// gone for good), starting `after` seconds from now.
    #[pyo3(signature = (calls, seconds, after = 0.0, error = "GPU_IS_LOST"))]
    fn inject_fault(&self, calls: &str, seconds: f64, after: f64, error: &str) -> PyResult<()> {
        let bits = board::call_bits(calls).map_err(PyValueError::new_err)?;
        let code = board::error_code(error)
            .ok_or_else(|| PyValueError::new_err(format!("unknown NVML error {error:?}")))?;
        if seconds.is_nan() || seconds <= 0.0 || !after.is_finite() || after < 0.0 {
            return Err(PyValueError::new_err(format!(
                "a fault needs seconds > 0 and after >= 0 (got seconds={seconds}, after={after})"
            )));
        }
        let now = self.cluster.clock().now();
        self.gpu.inject_fault(board::Fault {
            calls: bits,
            from: now + after,
            until: now + after + seconds,
            code,
            gpu: None,
        });
        Ok(())
    }

    /// Reset the energy counter to 0 now, as a driver reload does.
    fn reset_counter(&self) {
        self.gpu.reset_counter();
    }

    /// Stop the energy counter where it stands (a board whose counter froze).
    fn freeze_counter(&self) {
        self.gpu.freeze_counter();
    }
}

/// The simulated CPU packages of this process (`ZEUS_SIM_CPUS=N`): a powercap tree on disk.
#[pyclass(name = "SimCpus", module = "zeus._core.sim", frozen)]
pub(crate) struct PySimCpus {
    inner: Arc<SimRapl>,
}

#[pymethods]
impl PySimCpus {
    /// The process's simulated CPUs (`RuntimeError` without `ZEUS_SIM_CPUS`).
    #[staticmethod]
    fn current(py: Python<'_>) -> PyResult<Self> {
        let inner = crate::device::cpu::sim::global()
            .cpu_err(py)?
            .ok_or_else(|| {
                PyRuntimeError::new_err("no simulated CPUs: set ZEUS_SIM_CPUS=N to opt in")
            })?;
        Ok(PySimCpus { inner })
    }

    /// The model's energy (J) of package `index` and its DRAM from the model's origin up to
    /// UNIX time `unix_time`. Needs no simulator in this process: the model runs on
    /// wall-clock time, so differences give the truth for a stretch another process simulated.
    #[staticmethod]
    fn model_energy(index: usize, unix_time: f64) -> PyResult<(f64, f64)> {
        if !unix_time.is_finite() {
            return Err(PyValueError::new_err(format!(
                "unix_time must be a finite number of seconds, got {unix_time}"
            )));
        }
        Ok(crate::device::cpu::sim::model_energy_j(index, unix_time))
    }

    fn __len__(&self) -> usize {
        self.inner.packages()
    }

    /// Exact cumulative energy (J) of package `index` and of its DRAM, now.
    fn true_energy(&self, py: Python<'_>, index: usize) -> PyResult<(f64, f64)> {
        self.inner.true_energy_j(index).cpu_err(py)
    }

    /// Cumulative energy (J) of package `index` and of its DRAM as of the writer's newest
    /// complete write: the least a counter read made after this call can show.
    fn published_energy(&self, py: Python<'_>, index: usize) -> PyResult<(f64, f64)> {
        self.inner.published_energy_j(index).cpu_err(py)
    }

    /// Model power (W) of package `index` and of its DRAM, now.
    fn true_power(&self, py: Python<'_>, index: usize) -> PyResult<(f64, f64)> {
        self.inner.true_power_w(index).cpu_err(py)
    }

    /// The powercap tree's root and its packages' wrap range (µJ).
    #[getter]
    fn rapl_tree(&self) -> (String, u64) {
        (
            self.inner.dir().display().to_string(),
            self.inner.max_energy_range_uj(),
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySimCluster>()?;
    m.add_class::<PySimGpu>()?;
    m.add_class::<PySimCpus>()?;
    Ok(())
}
