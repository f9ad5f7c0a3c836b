"""`GlobalPowerLimitOptimizer`: profile power limits during training, then keep the best.

The optimizer walks the power limits of the GPUs from the maximum down to the minimum in steps of
`pl_step` W. At each limit it warms up for `warmup_steps` training steps, then measures time and
energy over `profile_steps` steps. When every limit is measured, the optimum selector picks one
and training continues at it. An epoch that ends in the middle of a warmup or a measurement
interrupts it: the limit goes back to the maximum for the rest of the epoch (evaluation and data
loading should not be slowed down) and that limit is retried at the next epoch's first step.

The walk is `PowerLimitProfiler` (`profiler.py`), the one profiling state machine, which
`JobSession` drives as well; this class sets the limits it asks for through a `SettingsGuard`,
all-reduces its windows under `torch.distributed` and, once done, trains at the optimum.

States (`zeus.optimizer.power_limit.models`):

- `Ready(pl, s)`: after `s` steps, set `pl` and go to `Warmup` (straight to `Profiling` when
  `warmup_steps == 0`).
- `Warmup(pl, s)`: after `s` steps, open the measurement window and go to `Profiling`.
- `Profiling(pl, s)`: after `s` steps, close the window, record it, and go on to the next limit
  or to `Done`.
- `Done(opt)`: nothing left to do.

An epoch end in `Warmup` or `Profiling` (the window is cancelled) goes to `Ready(pl, 1)` and
sets the maximum limit. Epochs too short for `warmup_steps + profile_steps + 1` steps would
interrupt every limit: one `UserWarning` says so, with the numbers and settings that fit.

A window that cannot be trusted (it read 0 J, or the monitor's ~95% bound on its energy is as
large as the energy, or, for a window shorter than the energy counter's update period, as one
update) is not recorded: the limit is measured again at once over a longer window, later
limits over as many steps, and each measurement is scaled to `profile_steps` steps; one
`UserWarning` gives the figures and the `profile_steps` that avoids it.

Deliberate differences from zeus 0.8: scanned limits never go below the device minimum;
`warmup_steps=0` works (measuring starts on the step that sets the limit); only the monitor's
GPUs must share a power-limit range (zeus 0.8 required every visible GPU to be the same model);
the power limit in force before the optimizer started (not the maximum) is restored at exit, on
SIGINT/SIGTERM and, through an on-disk journal, after SIGKILL (see
`zeus.device.settings` and `python -m zeus.device restore`); once `Done`,
`on_step_begin` is rebound to a no-op, so a step costs one empty call.

Data parallelism with `torch.distributed`: each rank creates its own optimizer with a monitor of
its own GPUs (usually `ZeusMonitor(gpu_indices=[local_rank])`). When the default process group
is initialised, each profiling window's energy (and its bound) is summed and its time maxed over
all ranks with `all_reduce`, so every rank holds the same measurements, repeats the same windows
and picks the same power limit; the default selector's `world_size` is then the number of GPUs
over all ranks. All ranks must call the hooks at the same steps (which data-parallel training
does).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Union

from pydantic import ValidationError

from zeus.callback import Callback
from zeus.device import get_gpus
from zeus.device.exception import ZeusGPUNoPermissionError, ZeusGPUNotSupportedError
from zeus.device.settings import SettingsGuard, restore_stale
from zeus.optimizer.power_limit.models import (
    Done,
    PowerLimitMeasurement,
    Profiling,
    Ready,
    Warmup,
    _PowerLimitMeasurementList,
)
from zeus.optimizer.power_limit.profiler import (
    DEFAULT_PL_STEP_W,
    PowerLimitProfiler,
    SettingNames,
    WindowFigures,
)
from zeus.optimizer.power_limit.selectors import OptimumSelector, ZeusCost
from zeus.util import framework
from zeus.util.logging import get_logger

__all__ = ["GlobalPowerLimitOptimizer"]

logger = get_logger(__name__)

_WINDOW_PREFIX = "__GlobalPowerLimitOptimizer_"
_SETTING_NAMES = SettingNames(
    warmup="warmup_steps",
    profile="profile_steps",
    example="warmup_steps={warmup}, profile_steps={profile}",
)


def _noop() -> None:
    """`on_step_begin` once the optimizer is `Done`: nothing is left to do."""


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        bound = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _all_reduce_figures(figures: WindowFigures) -> WindowFigures:
    """Sum energy and its bound, max time and counter period, over the ranks (if any).

    Every rank then judges the same figures, so all of them keep or repeat a window together.
    """
    if framework.world_size() == 1:
        return figures
    energy, bound = framework.all_reduce([figures.energy, figures.bound], "sum")
    time, period = framework.all_reduce([figures.time, figures.period], "max")
    return WindowFigures(energy=energy, time=time, bound=bound, period=period)


def _no_permission_message(gpus: Any, error: Exception) -> str:
    """Why GPU settings cannot be changed, the real cause first, and the ways out."""
    if getattr(gpus, "zeusd", None) is not None:
        # The daemon answered: its reason (a missing or rejected token, a disabled API group)
        # is the cause, not this process's privileges.
        return f"zeusd refused to change GPU settings: {error}"
    return (
        "Changing GPU power limits needs root (SYS_ADMIN), which this process does not have. "
        "Run it as root; or let zeusd, the privileged daemon, make the changes for it "
        "(`zeusd unit` installs it; then set ZEUSD_SOCK_PATH, see docs/zeusd.md); or, in a "
        f"Docker container, start it with --cap-add SYS_ADMIN. ({error})"
    )


def _load_profile(path: Path) -> list[PowerLimitMeasurement]:
    """The measurements of a profile file, or a `ValueError` naming the file and the fault."""
    try:
        profile = _PowerLimitMeasurementList.model_validate_json(path.read_text())
    except ValidationError as e:
        faults = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or 'file'}: {err['msg']}"
            for err in e.errors()[:3]
        )
        raise ValueError(
            f"{path} is not a power limit profile ({faults}); it should read "
            '{"measurements": [{"power_limit": W, "energy": J, "time": s}, ...]} with '
            "positive numbers. Delete it to profile again."
        ) from None
    return list(profile.measurements)


class GlobalPowerLimitOptimizer(Callback):
    """Finds the optimal GPU power limit while training runs, then trains at it.

    Call `on_step_begin` at the start of every training step and `on_epoch_end` at the end of
    every epoch (`on_epoch_begin` and `on_step_end` are accepted and do nothing). All GPUs of the
    monitor get the same power limit.

    Attributes:
        state: The current state (`Ready`, `Warmup`, `Profiling` or `Done`).
        measurements: One `PowerLimitMeasurement` per profiled limit, in profiling order, each
            over `profile_steps` steps.
        power_limits: The limits to profile, mW, descending.

    """

    def __init__(
        self,
        monitor: Any,
        optimum_selector: Union[OptimumSelector, None] = None,
        wait_steps: int = 1,
        warmup_steps: int = 10,
        profile_steps: int = 40,
        pl_step: int = DEFAULT_PL_STEP_W,
        profile_path: Union[str, Path, None] = None,
    ) -> None:
        """Set up the optimizer and set the GPUs to their maximum power limit.

        Args:
            monitor: A `ZeusMonitor` (anything with `gpu_indices`, `begin_window` and
                `end_window`) measuring the GPUs to optimise.
            optimum_selector: Picks the optimal limit; default `ZeusCost(eta_knob=0.5,
                world_size=<number of GPUs over all ranks>)`.
            wait_steps: Steps to let pass before profiling begins.
            warmup_steps: Steps to run at each limit before measuring it (0 allowed).
            profile_steps: Steps to measure at each limit (more when windows this long are
                too short to be measured; see the module docstring).
            pl_step: Distance between profiled limits, W.
            profile_path: A profile JSON file. If it exists, it is loaded, the optimum is set
                right away and nothing is profiled; otherwise the profile is written there
                (atomically) when profiling ends.

        Raises:
            ValueError: a bad argument (the message names it), GPUs with different power
                limit ranges, or a `profile_path` that holds no profile.
            RuntimeError: the process may not change GPU settings (needs SYS_ADMIN).

        """
        self.wait_steps = _check_int("wait_steps", wait_steps, 0)
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
        self.profile_steps = _check_int("profile_steps", profile_steps, 1)
        self.pl_step = _check_int("pl_step", pl_step, 1) * 1000
        if optimum_selector is not None and not isinstance(optimum_selector, OptimumSelector):
            raise ValueError(
                f"optimum_selector must be an OptimumSelector, got {optimum_selector!r}"
            )
        self.monitor = monitor
        self.gpu_indices = list(monitor.gpu_indices)
        if not self.gpu_indices:
            raise ValueError(f"the monitor measures no GPUs (gpu_indices={self.gpu_indices})")
        self.world_size = len(self.gpu_indices) * framework.world_size()
        self.optimum_selector = optimum_selector or ZeusCost(
            eta_knob=0.5, world_size=self.world_size
        )
        self.profile_path = Path(profile_path) if profile_path is not None else None

        self.gpus = get_gpus()
        # Put back what a killed earlier run left behind, before reading "original" limits.
        restore_stale(self.gpus)

        ranges = {
            i: tuple(self.gpus.get_power_management_limit_constraints(i)) for i in self.gpu_indices
        }
        if len(set(ranges.values())) != 1:
            raise ValueError(f"Power limits ranges are not uniform across GPUs: {ranges} (mW).")
        min_mw, max_mw = next(iter(ranges.values()))

        try:
            for i in self.gpu_indices:
                self.gpus.set_persistence_mode(i, True)
        except ZeusGPUNotSupportedError as e:
            logger.warning("Cannot enable persistence mode (%s); continuing without it.", e)
        except ZeusGPUNoPermissionError as e:
            raise RuntimeError(_no_permission_message(self.gpus, e)) from e

        self.guard = SettingsGuard(self.gpus)
        self._current_mw = 0
        self._profile_loaded = False
        self._profiler = PowerLimitProfiler(
            monitor,
            min_mw,
            max_mw,
            selector=self.optimum_selector,
            set_power_limit=self._set_power_limit,
            on_done=self._settle,
            name="GlobalPowerLimitOptimizer",
            window_prefix=_WINDOW_PREFIX,
            setting_names=_SETTING_NAMES,
            warmup_steps=self.warmup_steps,
            profile_steps=self.profile_steps,
            wait_steps=self.wait_steps,
            pl_step_mw=self.pl_step,
            reduce=_all_reduce_figures,
        )
        # A profiling step is the profiler's step: skip a call layer on every training step.
        self.on_step_begin = self._profiler.step  # type: ignore[method-assign]

        if self.profile_path is not None and self.profile_path.exists():
            logger.info("Loading the power limit profile from %s.", self.profile_path)
            measurements = _load_profile(self.profile_path)
            self._profile_loaded = True
            self._profiler.conclude(measurements)
        else:
            self._set_power_limit(self.power_limits[0])

    @property
    def state(self) -> Ready | Warmup | Profiling | Done:
        """The current state (`Ready`, `Warmup`, `Profiling` or `Done`)."""
        return self._profiler.state

    @property
    def measurements(self) -> list[PowerLimitMeasurement]:
        """One `PowerLimitMeasurement` per profiled limit, in profiling order."""
        return self._profiler.measurements

    @property
    def power_limits(self) -> list[int]:
        """The limits to profile, mW, descending."""
        return self._profiler.power_limits

    # Hooks.

    def on_epoch_end(self) -> None:
        """Interrupt a warmup or measurement: back to the maximum, retry the limit next epoch."""
        self._profiler.end_epoch()

    def on_step_begin(self) -> None:
        """Advance the state machine by one step."""
        self._profiler.step()

    @property
    def current_power_limit(self) -> int:
        """The power limit this optimizer last set, mW (0 before the first or after restore)."""
        # A signal or exit hook may have restored the guard behind this object's back.
        return self._current_mw if self.guard.active else 0

    # Context manager and cleanup.

    def close(self) -> None:
        """Restore the GPUs' original power limits now (also done at exit and on signals)."""
        for line in self.guard.restore():
            logger.info("[GlobalPowerLimitOptimizer] %s.", line)
        self._current_mw = 0

    def __enter__(self) -> GlobalPowerLimitOptimizer:
        """Use as `with GlobalPowerLimitOptimizer(...) as plo:`; limits are restored on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore the original power limits, also when the block raised."""
        self.close()

    # What the profiler calls.

    def _settle(self, optimal_mw: int) -> None:
        """Train at the optimum from now on; save the profile if it was just measured."""
        self._set_power_limit(optimal_mw)
        # Nothing is left to do per step: make the hook as cheap as a call can be.
        self.on_step_begin = _noop  # type: ignore[method-assign]
        if not self._profile_loaded:
            self._save_profile()

    def _set_power_limit(self, power_limit_mw: int) -> None:
        if power_limit_mw == self.current_power_limit:
            return
        logger.info(
            "[GlobalPowerLimitOptimizer] Setting power limit to %d W.", power_limit_mw // 1000
        )
        for i in self.gpu_indices:
            self.guard.set_power_limit(i, power_limit_mw)
        self._current_mw = power_limit_mw

    def _save_profile(self) -> None:
        if self.profile_path is None:
            return
        body = _PowerLimitMeasurementList(measurements=self.measurements).model_dump_json(indent=4)
        directory = self.profile_path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.profile_path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.profile_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        logger.info("[GlobalPowerLimitOptimizer] Profile saved to %s.", self.profile_path)
