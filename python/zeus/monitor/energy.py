"""`ZeusMonitor`: time and GPU (and optionally CPU and DRAM) energy of named code windows.

Window bookkeeping, energy-counter arithmetic and log writing live in the Rust extension
(`zeus._core.monitor.ZeusMonitor`); this class only resolves the GPUs and the framework's
CUDA sync, so `begin_window` and `end_window` are direct calls into Rust.
"""

from __future__ import annotations

import atexit
import os
from functools import partial
from pathlib import Path
from typing import Literal, Optional, Sequence

from zeus import _core
from zeus.device import GPUs, get_gpus
from zeus.device.cpu import get_cpus
from zeus.monitor.power import PowerMonitor
from zeus.util.framework import FRAMEWORKS, SyncWith, imported_sync
from zeus.util.indices import check_indices
from zeus.util.multiprocessing import warn_if_global_in_subprocess

Measurement = _core.monitor.Measurement
Provenance = _core.monitor.Provenance

__all__ = ["Measurement", "MeasurementState", "Provenance", "ZeusMonitor"]

# The energy sampler is a Rust thread; stop it before the interpreter finalises.
atexit.register(_core.monitor.stop_sampler)


class MeasurementState(tuple):  # type: ignore[type-arg]
    """Where an open window started: `ZeusMonitor.measurement_states[key]`.

    A 2-tuple `(time, gpu_energy)`, the shape zeus 0.8.2 gave (so `t, e = state` and
    `state[0]` keep working), with Zeus 0.16's attribute names.

    Attributes:
        time: The window's start timestamp (the GPU backend's clock, `time.time()` but on the
            simulator's virtual clock).
        gpu_energy: Each GPU's total-energy counter at the start, J, by GPU index; GPUs without
            a counter (older than Volta, measured by power integration) are absent.
        cpu_energy: Each monitored CPU package's energy at the start, J, by package index;
            None when the monitor measures no CPU.
        dram_energy: As `cpu_energy`, for DRAM (packages with a DRAM zone only).

    """

    cpu_energy: Optional[dict[int, float]]
    dram_energy: Optional[dict[int, float]]

    def __new__(
        cls,
        time: float,
        gpu_energy: dict[int, float],
        cpu_energy: Optional[dict[int, float]] = None,
        dram_energy: Optional[dict[int, float]] = None,
    ) -> MeasurementState:
        """Make the state from its start time and start energies."""
        self = super().__new__(cls, (time, gpu_energy))
        self.cpu_energy = cpu_energy
        self.dram_energy = dram_energy
        return self

    @property
    def time(self) -> float:
        """The window's start timestamp."""
        return self[0]  # type: ignore[no-any-return]

    @property
    def gpu_energy(self) -> dict[int, float]:
        """Each GPU's counter at the start, J."""
        return self[1]  # type: ignore[no-any-return]

    @property
    def total_energy(self) -> float:
        """The sum of every start energy, J (Zeus 0.16's property)."""
        return sum(
            sum(part.values())
            for part in (self.gpu_energy, self.cpu_energy, self.dram_energy)
            if part is not None
        )

    def __repr__(self) -> str:
        return (
            f"MeasurementState(time={self.time!r}, gpu_energy={self.gpu_energy!r}, "
            f"cpu_energy={self.cpu_energy!r}, dram_energy={self.dram_energy!r})"
        )

    def __reduce__(self) -> tuple[type[MeasurementState], tuple[object, ...]]:
        return (type(self), (self.time, self.gpu_energy, self.cpu_energy, self.dram_energy))


class ZeusMonitor(_core.monitor.ZeusMonitor):
    """Measure the time and GPU energy of code windows.

    Windows are identified by name; any number may be open at once, nested or overlapping.
    Energy comes from each GPU's total-energy counter (Volta and newer), or, for older GPUs, from
    integrating a `PowerMonitor` timeline that this monitor starts for them. Timestamps come
    from the GPU backend's clock (`gpus.now()`), so the simulator's virtual clock works.

    How counters are read (`reads`): a real driver updates the energy counter only every 100 ms
    or so, and one read costs milliseconds of CPU (3.5-6 ms on an H100). With `"cached"`, a
    process-wide Rust thread (the sampler) reads each counter just after it updates and watches
    the cheap power readings in between; window edges are then answered from its cache in
    microseconds, interpolated to the exact call time, and no counter is read on your thread.
    With `"direct"`, every window edge reads every counter (the reference's behaviour): costly
    on real GPUs and up to an update period stale, but it needs no thread and is exact on a
    device whose counter is exact at every call. `"auto"` (default) uses the cache on the real
    clock for counters that move in steps (every real GPU) and direct reads otherwise (the
    ideal simulated GPU, the simulator's virtual clock). The cache marks window edges as places
    where the load may step, which is what makes short windows accurate.

    Every figure says how far off it may be: `Measurement.gpu_energy_uncertainty` (and
    `cpu_energy_uncertainty`, `dram_energy_uncertainty`) hold a bound that the true energy lies
    within in about 95% of windows, and `gpu_energy_provenance` says how each GPU's figure was
    made (`cached_counter`, `direct_counter`, `power_integration` or `degraded`) and whether the
    sampler was calibrated. The sampler learns each board's timing (update periods, the
    counter's lag) and checks its model against every counter value; a board it cannot model
    is switched, with one `UserWarning`, to direct reads or power integration. Driver errors
    are retried and sampling resumes when reads work; a GPU that has answered nothing for 5 s
    makes `end_window` raise `ZeusBaseGPUError` naming it, with the window left open (see
    `docs/measurement-uncertainty.md`).

    Methods (implemented in Rust):
        begin_window(key, sync_cuda=True): Open window `key`. Raises `ValueError` if a window
            with that name is already open. `sync_execution` (keyword) is Zeus 0.16's name of
            `sync_cuda`.
        end_window(key, sync_cuda=True, cancel=False, exact=False) -> Measurement: Close window
            `key` and return its time and energy. Raises `ValueError` if it is not open. With
            `cancel` the measurement is all zeros and nothing is logged. With `exact`, cached
            GPUs wait (up to a few update periods) for the counter's next update so that the
            window's end is interpolated between counter values rather than extrapolated.

    CPUs (`cpu_indices`): package and DRAM energy come from RAPL (`zeus.device.cpu`). Each
    window edge reads the packages' `energy_uj` files (microseconds) through totals that the
    sampler thread keeps unwrapped, reading every zone at least once a second and often enough
    at the observed power that no counter wrap is missed, so windows of any length are right.
    Unlike Zeus 0.16, where `cpu_indices=None` means every package when RAPL is available,
    here `None` means no CPU: measuring CPUs is an explicit choice, so that GPU-only code keeps
    its `total_energy`, its log columns and never meets a RAPL permission error. Pass
    `cpu_indices=list(range(len(get_cpus())))` for every package.

    `sync_cuda` waits for queued GPU work first (PyTorch, JAX or CuPy, whichever is present
    with CUDA; a no-op without one; `sync_execution_with` names the framework instead).
    Windows shorter than the energy counter's update period warn once per name
    (`UserWarning`); so does a large disagreement between a counter and the power timeline of
    `power_monitor`, when one is given.

    Attributes:
        gpus: The `zeus.device.GPUs` object (`None` for a CPU-only monitor).
        gpu_indices: Monitored GPUs (framework indices, after `CUDA_VISIBLE_DEVICES`).
        cpu_indices: Monitored CPU packages, or `None` when no CPU is monitored.
        power_monitor: The `PowerMonitor` of the GPUs without an energy counter, or `None`.
        approx_instant_energy: See the argument.
        reads: See the argument.
        measurement_states: Open windows: `{key: MeasurementState}`, each a
            `(start_time, {gpu_index: start_energy_J})` tuple with Zeus 0.16's attributes
            `.time`, `.gpu_energy`, `.cpu_energy`, `.dram_energy`.

    Do not create a monitor at module level of code that spawns processes; create it where it
    is used (a monitor made while a spawned child re-imports the main script warns, as in
    Zeus 0.16: `zeus.util.multiprocessing`).

    Example:
        >>> from zeus.monitor import ZeusMonitor
        >>> monitor = ZeusMonitor(gpu_indices=[0])
        >>> monitor.begin_window("epoch")
        >>> train_one_epoch()  # your code  # doctest: +SKIP
        >>> m = monitor.end_window("epoch")
        >>> energy, bound = m.total_energy, m.total_energy_uncertainty  # J; ~95% bound
        >>> print(f"epoch: {m.time:.1f} s, {energy:.1f} J ± {bound:.1f} J")
        epoch: ... s, ... J ± ... J

    """

    def __init__(
        self,
        gpu_indices: Sequence[int] | None = None,
        approx_instant_energy: bool = False,
        log_file: str | os.PathLike[str] | None = None,
        power_monitor: PowerMonitor | None = None,
        reads: Literal["auto", "cached", "direct"] = "auto",
        cpu_indices: Sequence[int] | None = None,
        sync_execution_with: SyncWith | None = None,
    ) -> None:
        """Set up the monitor.

        Args:
            gpu_indices: GPUs to monitor (framework indices); all visible GPUs if `None`.
            approx_instant_energy: For windows too short for the energy counter to move (energy
                exactly 0), estimate energy as instantaneous power times elapsed time.
            log_file: CSV file receiving `start_time,window_name,elapsed_time,gpu{i}_energy,...`
                (then `cpu{i}_energy,dram{i}_energy` per monitored package when CPUs are
                monitored, the DRAM column only for packages with DRAM) and one flushed row per
                closed window. Parent directories are created.
            power_monitor: A running `PowerMonitor` covering some monitored GPUs, to cross-check
                their energy counters against (a large disagreement warns).
            reads: How energy counters are read: `"auto"`, `"cached"` (the sampler thread) or
                `"direct"` (a counter read at every window edge); see the class docstring.
            cpu_indices: CPU packages to monitor (RAPL package and DRAM energy). `None` (the
                default) or `[]` monitors no CPU; see the class docstring. With CPUs,
                `gpu_indices` may be `[]` for a CPU-only monitor (no GPU backend is opened then).
            sync_execution_with: The framework whose queued work a window sync waits for:
                `"torch"`, `"jax"` or `"cupy"` (Zeus 0.16's argument). `None` (the default)
                takes whichever is present with a GPU. A framework that is not installed or
                sees no GPU makes the sync a no-op, as nothing can have been queued through it.

        Raises:
            ValueError: `gpu_indices` is empty without CPUs, repeats a GPU or names one that
                is not visible; `cpu_indices` repeats or names a missing package;
                `reads` is not one of the three modes; or `sync_execution_with` is not a
                framework name.
            ZeusRAPLNotSupportedError: CPUs were asked for and no RAPL zone exists.
            ZeusRAPLPermissionError: CPUs were asked for and an `energy_uj` file is not
                readable (the message names it and says what to do).

        """
        warn_if_global_in_subprocess(self)
        indices = check_indices("gpu_indices", gpu_indices)
        # `[]` is how Zeus 0.16 code says "no CPU" (its docs tell users without RAPL to pass
        # it): the same as None here.
        cpus = check_indices("cpu_indices", cpu_indices) or None
        if sync_execution_with is not None and sync_execution_with not in FRAMEWORKS:
            raise ValueError(
                f"sync_execution_with={sync_execution_with!r}: expected one of "
                f"{', '.join(repr(f) for f in FRAMEWORKS)} or None"
            )
        # Looked up when a window first asks for a sync (and again after a miss, once a module
        # was imported): only a framework the program imported can have queued GPU work.
        resolve_sync = (
            imported_sync
            if sync_execution_with is None
            else partial(imported_sync, sync_execution_with)
        )
        cpu_only = indices == [] and cpus is not None
        self.gpus: GPUs | None = None if cpu_only else get_gpus()
        path = None
        if log_file is not None:
            path = os.fspath(Path(log_file))
        self.power_monitor: PowerMonitor | None = self._init(
            self.gpus,
            indices,
            bool(approx_instant_energy),
            path,
            resolve_sync,
            power_monitor,
            reads,
            None if cpus is None else get_cpus(),
            cpus,
        )
        if indices is None:
            indices = list(range(len(self.gpus))) if self.gpus is not None else []
        self.gpu_indices: list[int] = indices

    @property
    def measurement_states(self) -> dict[str, MeasurementState]:
        """Open windows by name, and where each started (a new dict each time)."""
        return {k: MeasurementState(*start) for k, start in self._window_starts().items()}

    def __repr__(self) -> str:
        """Show the monitored GPUs and CPUs."""
        if self.cpu_indices is None:
            return f"ZeusMonitor(gpu_indices={self.gpu_indices})"
        return f"ZeusMonitor(gpu_indices={self.gpu_indices}, cpu_indices={self.cpu_indices})"
