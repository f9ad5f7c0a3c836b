"""Drive the in-process simulated GPU (`ZEUS_GPU_BACKEND=sim`).

The simulated GPUs come from `ZEUS_SIM_GPUS` (comma-separated models, default `A40`; see
`known_presets()`), run on the real clock or, with `ZEUS_SIM_CLOCK=virtual`, on a virtual one that
moves only through `advance()` and `run()`. Device indices here are the simulator's own (before
`CUDA_VISIBLE_DEVICES`).

Simulated CPUs (`ZEUS_SIM_CPUS=N`, read once per process) are a powercap tree on disk that a
writer thread advances every millisecond; `cpu_true_energy()` gives their exact energy.

Example:
    >>> import zeus.device.sim
    >>> zeus.device.sim.set_busy(0)           # draw busy power from now on
    >>> seconds = zeus.device.sim.run(1.0)    # one unit of work on every GPU; returns its duration

"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterable, Sequence

from zeus import _core

# Each call asks for the process's current cluster: `reset()` may have rebuilt it.
_cluster = _core.sim.SimCluster.current
_cpus = _core.sim.SimCpus.current

__all__ = [
    "advance",
    "amdsmi_library_path",
    "cpu_count",
    "cpu_true_energy",
    "cpu_published_energy",
    "cpu_true_power",
    "cpu_model_energy",
    "device_count",
    "freeze_counter",
    "inject_fault",
    "is_busy",
    "is_virtual_clock",
    "known_presets",
    "now",
    "nvml_library_path",
    "presets",
    "rapl_tree",
    "reset",
    "reset_counter",
    "run",
    "set_busy",
    "set_power",
    "set_workload",
    "steady_state",
    "true_energy",
    "true_power",
    "workload_points",
]


def device_count() -> int:
    """Number of simulated GPUs."""
    return len(_cluster())


def presets() -> list[str]:
    """Model of each simulated GPU, e.g. `["A40", "V100"]`."""
    return _cluster().presets


def known_presets() -> list[str]:
    """Every model the simulator knows."""
    return _core.sim.SimCluster.known_presets()


def now() -> float:
    """Simulator time in seconds since the epoch."""
    return _cluster().now()


def is_virtual_clock() -> bool:
    """Whether the simulator runs on a virtual clock."""
    return _cluster().is_virtual_clock


def advance(seconds: float) -> None:
    """Move the virtual clock forward (`RuntimeError` on the real clock)."""
    _cluster().advance(seconds)


def set_busy(index: int = 0, busy: bool = True) -> None:
    """Mark simulated GPU `index` busy (drawing the workload's power) or idle."""
    _cluster().gpu(index).set_busy(busy)


def set_power(index: int, watts: float) -> None:
    """Make simulated GPU `index` draw `watts` from now on, whatever its workload.

    The board draws that power until its load changes (`set_busy`, `run`, or another
    `set_power`), so a test can make power follow a known function of each step's work and
    check energy against it (`true_energy`). Every reading follows it as it follows busy power:
    the energy counter, both power readings (at real fidelity, from their next update), and
    busy-looking utilisation and clocks while the power is above the board's idle power.

    Args:
        index: Simulated GPU index.
        watts: The power to draw. A board cannot draw above its power limit: the draw is
            clamped to the limit of each moment (lowering the limit lowers it; raising the limit
            again gives back what was asked).

    Raises:
        ValueError: `watts` is negative or not finite.

    """
    _cluster().gpu(index).set_power(watts)


def is_busy(index: int = 0) -> bool:
    """Whether simulated GPU `index` is busy now."""
    return _cluster().gpu(index).is_busy


def run(work: float = 1.0, gpu_indices: Iterable[int] | None = None, wait: bool = True) -> float:
    """Run `work` units (one unit = one `time_per_epoch` of the workload curve) on GPUs at once.

    Each GPU is busy for as long as its power limit and clocks need, then idle. On the virtual
    clock, time advances by the slowest GPU's duration; on the real clock this sleeps for it
    unless `wait` is false.

    Returns:
        The duration in seconds.

    """
    cluster = _cluster()
    indices = list(range(len(cluster))) if gpu_indices is None else list(gpu_indices)
    seconds = cluster.run(indices, work)
    if wait and not cluster.is_virtual_clock:
        time.sleep(seconds)
    return seconds


def set_workload(
    index: int, curve: str | os.PathLike[str] | Sequence[tuple[float, float, float]]
) -> None:
    """Replace GPU `index`'s workload curve.

    Args:
        index: Simulated GPU index.
        curve: A CSV path with `power_limit,time_per_epoch,average_power` columns (the Zeus
            trace format, one series), or a list of `(power_limit W, time_per_epoch s,
            average_power W)` points.

    """
    if isinstance(curve, (str, os.PathLike)):
        _cluster().gpu(index).set_workload_csv(os.fspath(curve))
    else:
        points = [(float(pl), float(t), float(w)) for pl, t, w in curve]
        _cluster().gpu(index).set_workload_points(points)


def workload_points(index: int = 0) -> list[tuple[float, float, float]]:
    """GPU `index`'s workload curve as `(power_limit, time_per_epoch, average_power)` points."""
    return _cluster().gpu(index).workload_points()


def steady_state(index: int = 0) -> tuple[float, float]:
    """`(seconds per unit of work, watts)` when busy at GPU `index`'s current settings."""
    return _cluster().gpu(index).steady_state()


def true_energy(index: int = 0, at: float | None = None) -> float:
    """The model's exact energy in joules (ground truth, unrounded).

    So far, or up to the moment `at` (seconds on the simulator's clock, which on the real clock
    is `time.time()`: the same as `ZeusMonitor`'s window times). Only a real-fidelity device
    remembers its past (its last seconds); elsewhere a past `at` is answered from the current
    stretch of load alone.
    """
    return _cluster().gpu(index).true_energy(at)


def true_power(index: int = 0) -> float:
    """The model's power now in watts, without reading noise."""
    return _cluster().gpu(index).true_power()


def inject_fault(
    index: int,
    calls: str,
    seconds: float,
    after: float = 0.0,
    error: str = "GPU_IS_LOST",
) -> None:
    """Make driver calls of GPU `index` fail, as a flaky driver does.

    Args:
        index: The simulated GPU.
        calls: Which calls fail: `energy`, `power`, `other` (writes included) or `write`
            (writes alone: a driver that refuses every change), joined by `+`, or `all`.
        seconds: How long they fail (`float("inf")`: the GPU is gone for good).
        after: Seconds from now until the fault starts.
        error: The NVML error they fail with, e.g. `GPU_IS_LOST`, `UNKNOWN`, `TIMEOUT`.

    Raises:
        ValueError: An unknown call or error name, or a negative time.

    """
    _cluster().gpu(index).inject_fault(calls, seconds, after, error)


def reset_counter(index: int = 0) -> None:
    """Reset GPU `index`'s energy counter to 0 now, as a driver reload does."""
    _cluster().gpu(index).reset_counter()


def freeze_counter(index: int = 0) -> None:
    """Stop GPU `index`'s energy counter where it stands (a board whose counter froze)."""
    _cluster().gpu(index).freeze_counter()


def cpu_count() -> int:
    """Number of simulated CPU packages (`ZEUS_SIM_CPUS=N`; `RuntimeError` without it)."""
    return len(_cpus())


def cpu_true_energy(index: int = 0) -> tuple[float, float]:
    """Exact cumulative energy (J) of simulated package `index` and of its DRAM, now.

    This is the model's integral, unwrapped and on the counters' scale (each `energy_uj` file
    holds it in µJ modulo the wrap range), so window energies compare against its differences.
    """
    return _cpus().true_energy(index)


def cpu_published_energy(index: int = 0) -> tuple[float, float]:
    """Energy (J) of simulated package `index` and of its DRAM as of the newest counter write.

    The counters are files a writer thread rewrites about every millisecond, and a loaded
    machine can hold that thread up for tens of milliseconds (real RAPL hardware does not lag
    so). A counter read made after this call shows at least this energy and at most what
    `cpu_true_energy()` gives after the read, so the two bracket what the read saw.
    """
    return _cpus().published_energy(index)


def cpu_true_power(index: int = 0) -> tuple[float, float]:
    """Model power (W) of simulated package `index` and of its DRAM, now."""
    return _cpus().true_power(index)


def cpu_model_energy(index: int, unix_time: float) -> tuple[float, float]:
    """The simulated CPU model's energy (J) of package `index` and its DRAM up to `unix_time`.

    The model runs on wall-clock time, so the difference between two UNIX timestamps is the
    true energy of that stretch in any process simulating CPUs (an exporter, say), and this
    needs no simulator here: compare it with rates that Prometheus computed from the exporter.
    """
    return _core.sim.SimCpus.model_energy(index, unix_time)


def rapl_tree() -> tuple[Path, int]:
    """The simulated powercap tree's root and its packages' wrap range in µJ.

    The range is `ZEUS_SIM_RAPL_MAX_UJ`; DRAM zones wrap at an eighth of it.
    """
    root, range_uj = _cpus().rapl_tree
    return Path(root), range_uj


def reset() -> None:
    """Rebuild the simulated GPUs from the environment on next use (and forget `get_gpus()`)."""
    from zeus.device.gpu import reset_gpus

    _core.sim.SimCluster.reset()
    reset_gpus()


def nvml_library_path() -> Path:
    """Absolute path of the simulated `libnvidia-ml.so.1` shipped with this package.

    Point any NVML program at it with `LD_LIBRARY_PATH` set to its directory, or zeus itself with
    `ZEUS_NVML_LIB`. It reads the same `ZEUS_SIM_*` variables as the in-process simulator.

    Raises:
        FileNotFoundError: the package was built without it.

    """
    return _bundled("libnvidia-ml.so.1", "NVML")


def amdsmi_library_path() -> Path:
    """Absolute path of the simulated `libamd_smi.so` shipped with this package.

    Point zeus at it with `ZEUS_AMDSMI_LIB` (and `ZEUS_GPU_BACKEND=amd`), or AMD's own tools
    with `LD_LIBRARY_PATH` set to its directory. It reads the same `ZEUS_SIM_*` variables as the
    in-process simulator (default model MI300X); see `docs/simulated-amdsmi.md`.

    Raises:
        FileNotFoundError: the package was built without it.

    """
    return _bundled("libamd_smi.so", "amdsmi")


def _bundled(name: str, what: str) -> Path:
    # python/zeus/_bin, shipped with the wheel beside the `zeus` package files.
    path = Path(__file__).resolve().parents[2] / "_bin" / name
    if not path.is_file():
        raise FileNotFoundError(
            f"the simulated {what} library is missing at {path}; reinstall zeus from source "
            "(`pip install .` builds it)"
        )
    return path
