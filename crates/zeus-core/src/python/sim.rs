//! `zeus._core` functions that drive the in-process simulated GPU (`zeus.sim`).

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::errors::IntoPyResult;
use crate::device::sim::{self, CurvePoint, Load, SimCluster, WorkloadCurve};
use crate::device::Clock;

fn cluster(py: Python<'_>) -> PyResult<std::sync::Arc<SimCluster>> {
    sim::global_cluster().py_err(py)
}

/// Number of simulated GPUs (from `ZEUS_SIM_GPUS`).
#[pyfunction]
fn sim_device_count(py: Python<'_>) -> PyResult<usize> {
    Ok(cluster(py)?.devices().len())
}

/// Preset key of each simulated GPU.
#[pyfunction]
fn sim_presets(py: Python<'_>) -> PyResult<Vec<&'static str>> {
    Ok(cluster(py)?
        .devices()
        .iter()
        .map(|d| d.preset().key)
        .collect())
}

/// All known preset keys.
#[pyfunction]
fn sim_known_presets() -> Vec<&'static str> {
    sim::preset::keys()
}

/// Simulator time, seconds since the epoch.
#[pyfunction]
fn sim_now(py: Python<'_>) -> PyResult<f64> {
    Ok(cluster(py)?.clock().now())
}

#[pyfunction]
fn sim_is_virtual_clock(py: Python<'_>) -> PyResult<bool> {
    Ok(cluster(py)?.clock().is_virtual())
}

/// Advance the virtual clock.
#[pyfunction]
fn sim_advance(py: Python<'_>, seconds: f64) -> PyResult<()> {
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "seconds must be a finite number >= 0, got {seconds}"
        )));
    }
    if !cluster(py)?.clock().advance(seconds) {
        return Err(PyRuntimeError::new_err(
            "the simulated GPU runs on the real clock; set ZEUS_SIM_CLOCK=virtual to advance time",
        ));
    }
    Ok(())
}

/// Mark a simulated GPU busy or idle.
#[pyfunction]
fn sim_set_busy(py: Python<'_>, index: usize, busy: bool) -> PyResult<()> {
    let c = cluster(py)?;
    c.device(index)
        .py_err(py)?
        .set_load(if busy { Load::Busy } else { Load::Idle });
    Ok(())
}

#[pyfunction]
fn sim_is_busy(py: Python<'_>, index: usize) -> PyResult<bool> {
    let c = cluster(py)?;
    Ok(c.device(index).py_err(py)?.load() != Load::Idle)
}

/// Start `work` units on the given GPUs; returns the seconds the slowest needs. The virtual clock
/// is advanced by that much; on the real clock the caller waits.
#[pyfunction]
fn sim_run(py: Python<'_>, indices: Vec<usize>, work: f64) -> PyResult<f64> {
    if !(work.is_finite() && work >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "work must be a finite number >= 0, got {work}"
        )));
    }
    let c = cluster(py)?;
    c.run(&indices, work).py_err(py)
}

/// Replace a GPU's workload curve with `(power_limit W, time_per_epoch s, average_power W)` points.
#[pyfunction]
fn sim_set_workload_points(
    py: Python<'_>,
    index: usize,
    points: Vec<(f64, f64, f64)>,
) -> PyResult<()> {
    let curve = WorkloadCurve::new(
        points
            .into_iter()
            .map(|(pl, t, p)| CurvePoint {
                power_limit_w: pl,
                time_per_epoch_s: t,
                average_power_w: p,
            })
            .collect(),
    )
    .map_err(|e| PyValueError::new_err(e.to_string()))?;
    cluster(py)?
        .device(index)
        .py_err(py)?
        .set_curve(curve)
        .py_err(py)?;
    Ok(())
}

/// Replace a GPU's workload curve with one read from a CSV file.
#[pyfunction]
fn sim_set_workload_csv(py: Python<'_>, index: usize, path: std::path::PathBuf) -> PyResult<()> {
    let curve = WorkloadCurve::from_csv(&path).map_err(|e| PyValueError::new_err(e.to_string()))?;
    cluster(py)?
        .device(index)
        .py_err(py)?
        .set_curve(curve)
        .py_err(py)?;
    Ok(())
}

/// The GPU's workload curve as `(power_limit, time_per_epoch, average_power)` points.
#[pyfunction]
fn sim_workload_points(py: Python<'_>, index: usize) -> PyResult<Vec<(f64, f64, f64)>> {
    let c = cluster(py)?;
    let curve = c.device(index).py_err(py)?.curve();
    Ok(curve
        .points()
        .iter()
        .map(|p| (p.power_limit_w, p.time_per_epoch_s, p.average_power_w))
        .collect())
}

/// `(seconds per unit of work, watts)` when busy at the GPU's current settings.
#[pyfunction]
fn sim_steady_state(py: Python<'_>, index: usize) -> PyResult<(f64, f64)> {
    Ok(cluster(py)?.device(index).py_err(py)?.busy_steady_state())
}

/// The model's exact energy so far, J (ground truth for tests; no counter rounding).
#[pyfunction]
fn sim_true_energy(py: Python<'_>, index: usize) -> PyResult<f64> {
    Ok(cluster(py)?.device(index).py_err(py)?.true_energy_j())
}

/// The model's power right now, W, without reading noise.
#[pyfunction]
fn sim_true_power(py: Python<'_>, index: usize) -> PyResult<f64> {
    Ok(cluster(py)?.device(index).py_err(py)?.true_power_w())
}

/// Make the calls `calls` (`energy`, `power`, `other`, joined by `+`, or `all`) of GPU `index`
/// fail with NVML error `error` (a name such as `GPU_IS_LOST`) for `seconds` (infinite: gone
/// for good), starting `after` seconds from now.
#[pyfunction]
#[pyo3(signature = (index, calls, seconds, after = 0.0, error = "GPU_IS_LOST"))]
fn sim_inject_fault(
    py: Python<'_>,
    index: usize,
    calls: &str,
    seconds: f64,
    after: f64,
    error: &str,
) -> PyResult<()> {
    use crate::device::sim::board;
    let bits = board::call_bits(calls).map_err(PyValueError::new_err)?;
    let code = board::error_code(error)
        .ok_or_else(|| PyValueError::new_err(format!("unknown NVML error {error:?}")))?;
    if seconds.is_nan() || seconds <= 0.0 || !after.is_finite() || after < 0.0 {
        return Err(PyValueError::new_err(format!(
            "a fault needs seconds > 0 and after >= 0 (got seconds={seconds}, after={after})"
        )));
    }
    let c = cluster(py)?;
    let dev = c.device(index).py_err(py)?;
    let now = c.clock().now();
    dev.inject_fault(board::Fault {
        calls: bits,
        from: now + after,
        until: now + after + seconds,
        code,
        gpu: None,
    });
    Ok(())
}

/// Reset GPU `index`'s energy counter to 0 now, as a driver reload does.
#[pyfunction]
fn sim_reset_counter(py: Python<'_>, index: usize) -> PyResult<()> {
    cluster(py)?.device(index).py_err(py)?.reset_counter();
    Ok(())
}

/// Stop GPU `index`'s energy counter where it stands (a board whose counter froze).
#[pyfunction]
fn sim_freeze_counter(py: Python<'_>, index: usize) -> PyResult<()> {
    cluster(py)?.device(index).py_err(py)?.freeze_counter();
    Ok(())
}

/// Forget the simulated cluster; the next use rebuilds it from the environment.
#[pyfunction]
fn sim_reset() {
    sim::reset_global_cluster();
}

fn sim_cpus(py: Python<'_>) -> PyResult<std::sync::Arc<crate::device::cpu::sim::SimRapl>> {
    use super::device::cpu::IntoCpuResult;
    crate::device::cpu::sim::global()
        .cpu_err(py)?
        .ok_or_else(|| PyRuntimeError::new_err("no simulated CPUs: set ZEUS_SIM_CPUS=N to opt in"))
}

/// Number of simulated CPU packages (from `ZEUS_SIM_CPUS`).
#[pyfunction]
fn sim_cpu_count(py: Python<'_>) -> PyResult<usize> {
    Ok(sim_cpus(py)?.packages())
}

/// Exact cumulative energy (J) of simulated package `index` and of its DRAM, now.
#[pyfunction]
fn sim_cpu_true_energy(py: Python<'_>, index: usize) -> PyResult<(f64, f64)> {
    use super::device::cpu::IntoCpuResult;
    sim_cpus(py)?.true_energy_j(index).cpu_err(py)
}

/// Cumulative energy (J) of simulated package `index` and of its DRAM as of the writer's newest
/// complete write: the least a counter read made after this call can show.
#[pyfunction]
fn sim_cpu_published_energy(py: Python<'_>, index: usize) -> PyResult<(f64, f64)> {
    use super::device::cpu::IntoCpuResult;
    sim_cpus(py)?.published_energy_j(index).cpu_err(py)
}

/// Model power (W) of simulated package `index` and of its DRAM, now.
#[pyfunction]
fn sim_cpu_true_power(py: Python<'_>, index: usize) -> PyResult<(f64, f64)> {
    use super::device::cpu::IntoCpuResult;
    sim_cpus(py)?.true_power_w(index).cpu_err(py)
}

/// The simulated CPU model's energy of package `index` and its DRAM from the model's origin up
/// to UNIX time `unix_time`, J. Needs no simulator in this process: the model runs on wall-clock
/// time, so differences give the truth for a stretch another process simulated.
#[pyfunction]
fn sim_cpu_model_energy(index: usize, unix_time: f64) -> PyResult<(f64, f64)> {
    if !unix_time.is_finite() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "unix_time must be a finite number of seconds, got {unix_time}"
        )));
    }
    Ok(crate::device::cpu::sim::model_energy_j(index, unix_time))
}

/// The simulated powercap tree's root and its wrap range (µJ).
#[pyfunction]
fn sim_rapl_tree(py: Python<'_>) -> PyResult<(String, u64)> {
    let s = sim_cpus(py)?;
    Ok((s.dir().display().to_string(), s.max_energy_range_uj()))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sim_cpu_count, m)?)?;
    m.add_function(wrap_pyfunction!(sim_cpu_true_energy, m)?)?;
    m.add_function(wrap_pyfunction!(sim_cpu_published_energy, m)?)?;
    m.add_function(wrap_pyfunction!(sim_cpu_true_power, m)?)?;
    m.add_function(wrap_pyfunction!(sim_rapl_tree, m)?)?;
    m.add_function(wrap_pyfunction!(sim_cpu_model_energy, m)?)?;
    m.add_function(wrap_pyfunction!(sim_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(sim_presets, m)?)?;
    m.add_function(wrap_pyfunction!(sim_known_presets, m)?)?;
    m.add_function(wrap_pyfunction!(sim_now, m)?)?;
    m.add_function(wrap_pyfunction!(sim_is_virtual_clock, m)?)?;
    m.add_function(wrap_pyfunction!(sim_advance, m)?)?;
    m.add_function(wrap_pyfunction!(sim_set_busy, m)?)?;
    m.add_function(wrap_pyfunction!(sim_is_busy, m)?)?;
    m.add_function(wrap_pyfunction!(sim_run, m)?)?;
    m.add_function(wrap_pyfunction!(sim_set_workload_points, m)?)?;
    m.add_function(wrap_pyfunction!(sim_set_workload_csv, m)?)?;
    m.add_function(wrap_pyfunction!(sim_workload_points, m)?)?;
    m.add_function(wrap_pyfunction!(sim_steady_state, m)?)?;
    m.add_function(wrap_pyfunction!(sim_true_energy, m)?)?;
    m.add_function(wrap_pyfunction!(sim_true_power, m)?)?;
    m.add_function(wrap_pyfunction!(sim_inject_fault, m)?)?;
    m.add_function(wrap_pyfunction!(sim_reset_counter, m)?)?;
    m.add_function(wrap_pyfunction!(sim_freeze_counter, m)?)?;
    m.add_function(wrap_pyfunction!(sim_reset, m)?)?;
    Ok(())
}
