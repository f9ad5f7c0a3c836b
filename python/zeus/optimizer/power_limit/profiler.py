"""`PowerLimitProfiler`: the one state machine that profiles GPU power limits during training.

Both training-loop drivers profile through it: `GlobalPowerLimitOptimizer` (`optimizer.py`)
and the recurring-job session `JobSession` (`optimizer/recurring/run/session.py`). It owns the
limits to profile (from the maximum down in fixed steps, never below the minimum), the
warm-up and measurement window at each limit and the windows' names, whether a window's
figures can be trusted, and the choice of the optimum. The driver owns how a limit is set (a
settings guard, or the GPUs directly), what happens once the optimum is known, and its
settings.

Walk (states in `models.py`): `Ready(pl, s)` sets `pl` after `s` steps and warms up
(`Warmup`) or, without warm-up, opens the window at once (`Profiling`); `Warmup(pl, s)` opens
the window after `s` steps; `Profiling(pl, s)` closes it after `s` steps, records the limit
and starts the next one in the same step, or selects the optimum (`Done`). A window covers
the `s` steps that begin while it is open, so it is closed at the start of the step after its
last one.

An epoch end during a warm-up or a window cancels it: the maximum limit is set for the rest
of the epoch (evaluation and data loading are not slowed down) and the limit is tried again
from the first step of the next epoch. When the driver knows its epoch length
(`steps_per_epoch`), a limit is started only if its warm-up and window fit in what is left of
the epoch; otherwise the limit in force stays until the next epoch.

Unreliable windows: a window cannot rank power limits when it read no energy, or when the
monitor's ~95% bound on its energy (`Measurement.total_energy_uncertainty`) reaches the
energy itself or, for a window shorter than the energy counter's update period (from
`Measurement.gpu_energy_provenance`), the energy of one whole update: the bound of a counter
read directly, which moves in updates, is that large, while an exact counter's stays far
below. Without a bound, a window shorter than the update period cannot be trusted either.
Such a limit is measured again at once over a longer window, and so are the limits after it;
every recorded measurement is scaled to `profile_steps` steps, so all of them stay
comparable. One `UserWarning` gives the figures and the setting to raise. Epochs too short to
hold a warm-up and a window are named once too, with the numbers and the settings to lower.
"""

from __future__ import annotations

import math
import operator
import sys
import warnings
from dataclasses import dataclass
from types import FrameType
from typing import Any, Callable, NamedTuple, Sequence

from zeus.optimizer.power_limit.models import (
    Done,
    PowerLimitMeasurement,
    Profiling,
    Ready,
    Warmup,
)
from zeus.optimizer.power_limit.selectors import OptimumSelector
from zeus.util.logging import get_logger

__all__ = [
    "DEFAULT_PL_STEP_W",
    "PowerLimitProfiler",
    "SettingNames",
    "WindowFigures",
    "power_limit_steps",
]

logger = get_logger(__name__)

DEFAULT_PL_STEP_W = 25
"""Distance between profiled power limits, W, unless the driver is told otherwise."""

# A remeasured window grows at least this much (nothing says how far off a 0 J window is) and
# at most this much per attempt (a bound far above a tiny energy would ask for absurd windows).
_MIN_GROWTH = 2.0
_MAX_GROWTH = 16.0
# Aim past the point where the bound equals the energy, not right at it.
_GROWTH_MARGIN = 1.5
# The window length suggested to users, in energy counter updates.
_SUGGESTED_COUNTER_UPDATES = 10


def power_limit_steps(
    min_mw: int, max_mw: int, step_mw: int = DEFAULT_PL_STEP_W * 1000
) -> list[int]:
    """Power limits to profile, mW: from the maximum down by `step_mw`, never below the minimum.

    Args:
        min_mw: The GPUs' lowest settable power limit, mW.
        max_mw: Their highest, mW.
        step_mw: Distance between profiled limits, mW.

    """
    return list(range(max_mw, min_mw - 1, -step_mw))


class SettingNames(NamedTuple):
    """How the driver's user sets warm-up and window lengths, for the advice in warnings.

    Attributes:
        warmup: The warm-up setting's name, e.g. `warmup_steps`.
        profile: The window setting's name, e.g. `profile_steps`.
        example: A format string with `{warmup}` and `{profile}` showing both set.

    """

    warmup: str
    profile: str
    example: str


@dataclass(frozen=True)
class WindowFigures:
    """What a profiling window measured, and how far its monitor says that can be trusted.

    Attributes:
        energy: Joules over all measured devices (and all ranks, once reduced).
        time: Seconds.
        bound: The monitor's ~95% bound on `energy`, J; 0 when it gives none.
        period: The slowest measured GPU's energy counter update period, s; 0 when unknown.

    """

    energy: float
    time: float
    bound: float = 0.0
    period: float = 0.0

    @classmethod
    def of(cls, measurement: Any) -> WindowFigures:
        """Read the figures of a monitor's `end_window` result (a `Measurement` or look-alike)."""
        bound = _finite_or_zero(getattr(measurement, "total_energy_uncertainty", 0.0))
        provenance = getattr(measurement, "gpu_energy_provenance", None) or {}
        periods = [_finite_or_zero(getattr(p, "update_period", None)) for p in provenance.values()]
        return cls(
            energy=float(measurement.total_energy),
            time=float(measurement.time),
            bound=bound,
            period=max(periods, default=0.0),
        )

    def problem(self) -> str | None:
        """Why these figures cannot rank power limits, or `None` when they can.

        A window's figure is swamped when the monitor's bound reaches its energy, or, for a
        window shorter than the counter's update period, the energy of one whole update at
        the window's power: a counter read directly moves in such updates, and its bound
        says so, while an exact counter's (or the sampler's interpolated) bound stays far
        below one update even over a few microseconds.
        """
        if not (math.isfinite(self.time) and self.time > 0):
            return "no time passed in it"
        if not (math.isfinite(self.energy) and self.energy > 0):
            return "it read no energy (the energy counter did not move within it)"
        short = self.time < self.period
        if self.bound > 0 and short:
            one_update_j = self.energy / self.time * self.period
            if self.bound >= one_update_j:
                return (
                    f"it is shorter than the energy counter's update period "
                    f"({self.period:.3g} s), and its ~95% bound (±{self.bound:.3g} J) exceeds "
                    f"the {one_update_j:.3g} J of one update, so the counter's steps decide it"
                )
        elif self.bound > 0 and self.bound >= self.energy:
            return (
                f"its ~95% bound (±{self.bound:.3g} J) is as large as the energy itself, "
                "so nothing tells it from zero"
            )
        if self.bound == 0 and short:
            return f"it is shorter than the energy counter's update period ({self.period:.3g} s)"
        return None

    def growth(self) -> float:
        """How many times longer the next window should be for these figures to be usable."""
        if self.energy > 0 and self.bound > 0 and math.isfinite(self.energy):
            # A window's bound comes from its edges, so it stays put while energy grows.
            wanted = _GROWTH_MARGIN * self.bound / self.energy
        elif self.energy > 0 and 0 < self.time < self.period:
            wanted = _GROWTH_MARGIN * self.period / self.time
        else:
            wanted = _MIN_GROWTH
        return min(max(wanted, _MIN_GROWTH), _MAX_GROWTH)


def _warn(message: str) -> None:
    """Issue a `UserWarning` attributed to the first caller outside zeus's optimizers."""
    # The training loop's call is what the user can act on, however deep the drivers nest.
    frame: FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("zeus.optimizer."):
        frame = frame.f_back
        level += 1
    warnings.warn(message, UserWarning, stacklevel=level)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _finite_or_zero(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    value = float(value)
    return value if math.isfinite(value) and value > 0 else 0.0


class PowerLimitProfiler:
    """Walks the power limits, measures each over a window of steps and picks the optimum.

    The driver calls `step` at the start of every training step and `end_epoch` at the end of
    every training epoch; it learns the optimum through `on_done`.

    Attributes:
        power_limits: The limits to profile, mW, descending.
        measurements: One `PowerLimitMeasurement` per profiled limit, in profiling order, each
            over `profile_steps` steps (scaled when the window had to be longer).
        state: `Ready`, `Warmup`, `Profiling` or `Done`.
        window_steps: Steps measured per window: `profile_steps`, or more once a window was
            too short to be trusted.

    """

    def __init__(
        self,
        monitor: Any,
        min_mw: int,
        max_mw: int,
        *,
        selector: OptimumSelector,
        set_power_limit: Callable[[int], None],
        on_done: Callable[[int], None],
        name: str,
        window_prefix: str,
        setting_names: SettingNames,
        warmup_steps: int,
        profile_steps: int,
        wait_steps: int = 0,
        pl_step_mw: int = DEFAULT_PL_STEP_W * 1000,
        steps_per_epoch: int | None = None,
        reduce: Callable[[WindowFigures], WindowFigures] | None = None,
        sync: Callable[[], None] | None = None,
    ) -> None:
        """Set up the walk; nothing is set on the GPUs until the first `step`.

        Args:
            monitor: Opens and closes the windows (`begin_window`, `end_window`).
            min_mw: The GPUs' lowest power limit, mW.
            max_mw: Their highest, mW: profiled first, and set whenever an epoch interrupts.
            selector: Picks the optimum from the measurements.
            set_power_limit: Sets a limit (mW) on every GPU the monitor measures.
            on_done: Called with the optimum (mW) once it is chosen.
            name: The driver's name, for logs and warnings.
            window_prefix: Window names are this followed by the limit in watts.
            setting_names: How the driver's user sets `warmup_steps` and `profile_steps`.
            warmup_steps: Steps at each limit before its window opens (0 allowed).
            profile_steps: Steps each window measures (at least 1).
            wait_steps: Steps before the first limit is set.
            pl_step_mw: Distance between profiled limits, mW.
            steps_per_epoch: Training steps per epoch when the driver knows it in advance;
                then a limit starts only if it can finish within the epoch.
            reduce: Combines a window's figures over data-parallel ranks (every rank must get
                the same result, so that all take the same path).
            sync: Called before a window closes, so that queued GPU work is finished.

        """
        self.monitor = monitor
        self.selector = selector
        self.name = name
        self.window_prefix = window_prefix
        self.setting_names = setting_names
        self.warmup_steps = warmup_steps
        self.profile_steps = profile_steps
        self.window_steps = profile_steps
        self.steps_per_epoch = steps_per_epoch
        self.power_limits: list[int] = power_limit_steps(min_mw, max_mw, pl_step_mw)
        self.measurements: list[PowerLimitMeasurement] = []
        self.state: Ready | Warmup | Profiling | Done = Ready(
            next_power_limit=self.power_limits[0], steps=wait_steps + 1
        )
        self._set_power_limit = set_power_limit
        self._on_done = on_done
        self._reduce = reduce
        self._sync = sync
        self._epoch_steps = 0
        self._longest_epoch = 0
        self._warned_unreliable = False
        self._warned_short_epochs = False

    # Driver hooks.

    def step(self) -> None:
        """Advance by one training step (call at the start of every step)."""
        self._epoch_steps += 1
        state = self.state
        if isinstance(state, Done):
            return
        # Count down through the model's field storage: pydantic's `__setattr__` would cost
        # about a microsecond per step, and the assignment needs no validation.
        fields = state.__dict__
        left = fields["steps"] - 1
        fields["steps"] = left
        if left > 0:
            return
        if isinstance(state, Ready):
            self._start_or_wait(state.next_power_limit)
        elif isinstance(state, Warmup):
            self._open_window(state.current_power_limit)
        else:
            self._close_window(state.current_power_limit)

    def end_epoch(self) -> None:
        """Interrupt a warm-up or window: back to the maximum, retry the limit next epoch."""
        epoch_steps, self._epoch_steps = self._epoch_steps, 0
        self._longest_epoch = max(self._longest_epoch, epoch_steps)
        state = self.state
        if not isinstance(state, (Warmup, Profiling)):
            return
        pl = state.current_power_limit
        # Once the user has been told that epochs are too short, this would repeat forever.
        log = logger.debug if self._warned_short_epochs else logger.info
        what = "Warm-up" if isinstance(state, Warmup) else "Profiling"
        log(
            "[%s] %s for power limit %d W interrupted by the end of the epoch; retrying next "
            "epoch.",
            self.name,
            what,
            pl // 1000,
        )
        if isinstance(state, Profiling):
            self.monitor.end_window(self.window_name(pl), cancel=True)
        self.state = Ready(next_power_limit=pl, steps=1)
        self._set_power_limit(self.power_limits[0])
        if self._longest_epoch < self._steps_per_limit():
            self._warn_short_epochs(epoch_steps, pl, seen=True)

    def conclude(self, measurements: Sequence[PowerLimitMeasurement] | None = None) -> None:
        """Select the optimum, go to `Done` and tell the driver.

        Args:
            measurements: Measurements to select from instead of profiling (a loaded profile);
                by default, those profiled.

        Raises:
            TypeError: the selector returned something other than an integer of watts.

        """
        if measurements is not None:
            self.measurements[:] = measurements
        chosen = self.selector.select(self.measurements)
        try:
            # Any integer type (e.g. numpy's) is fine; floats and bools are not watts here.
            if isinstance(chosen, bool):
                raise TypeError
            optimal_w = operator.index(chosen)
        except TypeError:
            raise TypeError(
                f"{self.selector!r}.select returned {chosen!r}, not an integer of watts"
            ) from None
        self.state = Done(optimal_power_limit=optimal_w * 1000)
        logger.info("[%s] Optimal power limit is %d W.", self.name, optimal_w)
        self._on_done(optimal_w * 1000)

    def window_name(self, power_limit_mw: int) -> str:
        """The monitor window that measures `power_limit_mw`."""
        return f"{self.window_prefix}{power_limit_mw // 1000}"

    # Transitions.

    def _steps_per_limit(self) -> int:
        """Steps one limit needs within one epoch: warm-up, window and the closing step."""
        return self.warmup_steps + self.window_steps + 1

    def _fits(self, steps: int) -> bool:
        """Whether `steps` more steps from this one still lie within the epoch."""
        return self.steps_per_epoch is None or self._epoch_steps + steps <= self.steps_per_epoch

    def _start_or_wait(self, power_limit_mw: int) -> None:
        if self._fits(self.warmup_steps + self.window_steps):
            self._start(power_limit_mw)
        else:
            self._wait_for_next_epoch(power_limit_mw)

    def _wait_for_next_epoch(self, power_limit_mw: int) -> None:
        """Keep the limit in force; check again next step (only a new epoch has room)."""
        self.state = Ready(next_power_limit=power_limit_mw, steps=1)
        if self.steps_per_epoch is not None and self.steps_per_epoch < self._steps_per_limit():
            self._warn_short_epochs(self.steps_per_epoch, power_limit_mw, seen=False)

    def _start(self, power_limit_mw: int) -> None:
        """Set `power_limit_mw` and warm up at it (or measure right away without warm-up)."""
        self._set_power_limit(power_limit_mw)
        if self.warmup_steps > 0:
            self.state = Warmup(current_power_limit=power_limit_mw, steps=self.warmup_steps)
        else:
            self._open_window(power_limit_mw)

    def _open_window(self, power_limit_mw: int) -> None:
        logger.info(
            "[%s] Profiling power limit %d W over %d steps.",
            self.name,
            power_limit_mw // 1000,
            self.window_steps,
        )
        self.state = Profiling(current_power_limit=power_limit_mw, steps=self.window_steps)
        self.monitor.begin_window(self.window_name(power_limit_mw))

    def _close_window(self, power_limit_mw: int) -> None:
        if self._sync is not None:
            self._sync()
        figures = WindowFigures.of(self.monitor.end_window(self.window_name(power_limit_mw)))
        if self._reduce is not None:
            figures = self._reduce(figures)
        problem = figures.problem()
        if problem is not None:
            self._measure_again(power_limit_mw, figures, problem)
            return
        scale = self.profile_steps / self.window_steps
        measurement = PowerLimitMeasurement(
            power_limit=power_limit_mw // 1000,
            energy=figures.energy * scale,
            time=figures.time * scale,
        )
        self.measurements.append(measurement)
        logger.info(
            "[%s] Power limit %d W: %.2f J in %.3f s.",
            self.name,
            measurement.power_limit,
            measurement.energy,
            measurement.time,
        )
        index = self.power_limits.index(power_limit_mw)
        if index == len(self.power_limits) - 1:
            self.conclude()
        else:
            self._start_or_wait(self.power_limits[index + 1])

    def _measure_again(self, power_limit_mw: int, figures: WindowFigures, problem: str) -> None:
        """Measure the same limit again over a longer window (it is warmed up already)."""
        measured = self.window_steps
        self.window_steps = math.ceil(measured * figures.growth())
        self._warn_unreliable(power_limit_mw, figures, problem, measured)
        logger.info(
            "[%s] Power limit %d W: %.4g J in %.4g s over %d steps cannot be trusted: %s. "
            "Measuring it again over %d steps.",
            self.name,
            power_limit_mw // 1000,
            figures.energy,
            figures.time,
            measured,
            problem,
            self.window_steps,
        )
        if self._fits(self.window_steps):
            self._open_window(power_limit_mw)
        else:
            self._wait_for_next_epoch(power_limit_mw)

    # Warnings, each given once.

    def _warn_unreliable(
        self, power_limit_mw: int, figures: WindowFigures, problem: str, measured: int
    ) -> None:
        if self._warned_unreliable:
            return
        self._warned_unreliable = True
        counter = ""
        if 0 < figures.time < figures.period and "update period" not in problem:
            counter = f"; the energy counter updates only every {figures.period:.3g} s"
        advice = ""
        if figures.period > 0 and figures.time > 0:
            step_s = figures.time / measured
            target_s = _SUGGESTED_COUNTER_UPDATES * figures.period
            advice = (
                f" to about {max(1, round(target_s / step_s))} steps, so that a window spans "
                f"{_SUGGESTED_COUNTER_UPDATES} updates of the energy counter ({target_s:.3g} s "
                f"at the {step_s * 1000:.3g} ms per step seen here)"
            )
        _warn(
            f"[{self.name}] The profiling window of power limit {power_limit_mw // 1000} W is "
            f"unreliable: {figures.energy:.4g} J in {figures.time:.4g} s over "
            f"{_steps(measured)}; {problem}{counter}. Measuring that limit again over "
            f"{self.window_steps} steps, and the limits after it over as many (each "
            f"measurement is scaled to "
            f"{self.profile_steps} steps, so they stay comparable). To profile without "
            f"repeats, raise {self.setting_names.profile} (now {self.profile_steps}){advice}, "
            "or give each step more work."
        )

    def _warn_short_epochs(self, epoch_steps: int, power_limit_mw: int, seen: bool) -> None:
        if self._warned_short_epochs:
            return
        self._warned_short_epochs = True
        names = self.setting_names
        needed = self._steps_per_limit()
        grown = self.window_steps > self.profile_steps
        budget = epoch_steps - 1  # warm-up plus window; the closing step is the last one
        if grown and self.window_steps <= budget:
            warmup = budget - self.window_steps
            example = names.example.format(warmup=warmup, profile=self.window_steps)
            fix = (
                f"Windows need {self.window_steps} steps here to be trusted (see the earlier "
                f"warning); lower {names.warmup} to at most {warmup} and set {names.profile} "
                f"to {self.window_steps}, e.g. {example}, or give each step more work."
            )
        elif grown:
            fix = (
                f"Windows need {self.window_steps} steps here to be trusted (see the earlier "
                "warning), more than an epoch holds: give each step more work, or make "
                "epochs longer."
            )
        elif budget < 1:
            fix = "Power limits cannot be profiled in epochs of a single step."
        else:
            warmup = self.warmup_steps * budget // (self.warmup_steps + self.profile_steps)
            profile = budget - warmup
            fix = (
                f"Lower {names.warmup} and {names.profile} so that they add up to at most "
                f"{budget}, e.g. {names.example.format(warmup=warmup, profile=profile)}."
            )
        so_far = ", and no epoch so far was that long" if seen else ""
        _warn(
            f"[{self.name}] Epochs of {_steps(epoch_steps)} are too short to profile power limit "
            f"{power_limit_mw // 1000} W: one limit takes {needed} steps within one epoch "
            f"({self.warmup_steps} warm-up + {self.window_steps} measured + the step whose "
            f"start closes the window){so_far}; profiling cannot finish while epochs stay "
            f"this short. {fix}"
        )
