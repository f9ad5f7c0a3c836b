"""Thermally stable energy profiling of a repeated GPU workload (Zeus 0.16's `zeus.profile`).

Measuring the same workload back to back gives drifting energy figures: the GPU warms up, and
warm silicon leaks more power and may clock down. This module measures in *trials* that start
from a comparable thermal state, and finds how long a trial must be for its figure to repeat.

One trial:

    idle for cooldown_duration -> num_warmup_iterations calls (not measured)
        -> calls for about measurement_duration, inside one `ZeusMonitor` window

and reports the window's energy and time per call (`TrialResult`). The number of measured
calls is `measurement_duration` divided by the time of one call, which is *calibrated* first:
`num_warmup_iterations` calls, then `num_calibration_iterations` timed calls.

Public API:

- `measure`: one trial with durations you already know.
- `profile_measurement_duration`: sweep the measurement duration (cooldown fixed).
- `profile_cooldown_duration`: sweep the cooldown duration (measurement duration fixed).
- `profile_parameters`: both sweeps, the first with the longest cooldown of the search range,
  the second with the longest measurement duration.

A sweep runs `num_warmup_trials` throw-away trials (no cooldown, no warm-up calls, the longest
window) to bring the GPU to its working temperature, then `num_trials` trials per swept value.
A value whose energy per call has a sample standard deviation below `trial_stddev_threshold`
(joules) across its trials is *valid* (`SweepResult.is_valid`); the shortest valid durations
are the ones to pass to `measure`.

Energy comes from the `ZeusMonitor` you pass (all its GPUs, and its CPUs if it monitors any);
temperature is the mean of its GPUs' core temperatures, read before and after the window. Time
(the cooldown's idling included) runs on the GPU backend's clock, so the simulated GPU's
virtual clock works too (`ZEUS_GPU_BACKEND=sim`, `ZEUS_SIM_CLOCK=virtual`).

Distributed: every rank calls the same function with its own monitor (usually
`ZeusMonitor(gpu_indices=[local_rank])`). With a `torch.distributed` process group running,
the figures are combined across ranks (energy summed, time the slowest rank's, temperature
averaged; the calibrated call time is the slowest rank's, so every rank runs as many calls)
and only rank 0 logs. Progress goes to the `zeus.profile` logger at INFO level.

Example:
    ```python
    from zeus.monitor import ZeusMonitor
    from zeus.profile import measure, profile_parameters

    monitor = ZeusMonitor(gpu_indices=[0])
    m_report, c_report = profile_parameters(one_iteration, monitor)
    print(m_report)
    print(c_report)
    # The shortest durations whose trials repeated, as Zeus's guide picks them.
    m_dur = next(e.measurement_duration for e in m_report.entries if e.is_valid)
    c_dur = next(e.cooldown_duration for e in c_report.entries if e.is_valid)
    trial = measure(one_iteration, monitor, m_dur, c_dur)
    print(f"{trial.energy_per_iter:.3f} J per iteration")
    ```

"""

from __future__ import annotations

import logging
import math
import operator
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from zeus.device import GPUs
from zeus.monitor.energy import ZeusMonitor
from zeus.util import framework

__all__ = [
    "SweepReport",
    "SweepResult",
    "TrialResult",
    "measure",
    "profile_cooldown_duration",
    "profile_measurement_duration",
    "profile_parameters",
]

logger = logging.getLogger(__name__)

# Zeus 0.16's default search range for both durations: 1, 2, ..., 10 seconds.
_DEFAULT_SEARCH_RANGE = tuple(float(s) for s in range(1, 11))

# Monitor windows opened here; the names are Zeus 0.16's where it has one.
_TRIAL_WINDOW = "__zeus_profile_run_trial"
_CALIBRATION_WINDOW = "__zeus_profile_calibrate"

_SweepType = Literal["measurement_duration", "cooldown_duration"]


@dataclass
class TrialResult:
    """One trial's measurement (`measure` returns one; `SweepResult.trials` holds many).

    Attributes:
        energy_per_iter: Energy of one call of the target, in joules.
        time_per_iter: Time of one call of the target, in seconds.
        total_energy: Energy of the measured window, in joules.
        total_time: Length of the measured window, in seconds.
        iterations: Calls of the target in the measured window.
        temperature_before: Mean GPU temperature (°C) after the cooldown, before the window.
        temperature_after: Mean GPU temperature (°C) right after the window.
        total_energy_uncertainty: The monitor's ~95% bound on `total_energy`, in joules
            (`Measurement.total_energy_uncertainty`; not in Zeus 0.16).

    """

    energy_per_iter: float
    time_per_iter: float
    total_energy: float
    total_time: float
    iterations: int
    temperature_before: float
    temperature_after: float
    total_energy_uncertainty: float = 0.0


@dataclass
class SweepResult:
    """The trials of one swept value and their statistics (one entry of a `SweepReport`).

    Attributes:
        measurement_duration: Measurement duration of the trials, in seconds.
        cooldown_duration: Cooldown duration of the trials, in seconds.
        trials: Every trial, in the order run.
        energy_mean: Mean of the trials' `energy_per_iter`, in joules.
        energy_std: Sample standard deviation of the trials' `energy_per_iter` (0 for a single
            trial), in joules.
        avg_temperature_before: Mean of the trials' `temperature_before`, in °C.
        avg_temperature_after: Mean of the trials' `temperature_after`, in °C.
        avg_total_time: Mean of the trials' `total_time`, in seconds.
        avg_total_energy: Mean of the trials' `total_energy`, in joules.
        is_valid: Whether `energy_std` is below the sweep's `trial_stddev_threshold`.

    """

    measurement_duration: float
    cooldown_duration: float
    trials: list[TrialResult]
    energy_mean: float
    energy_std: float
    avg_temperature_before: float
    avg_temperature_after: float
    avg_total_time: float
    avg_total_energy: float
    is_valid: bool

    def _figures(self) -> str:
        tag = "VALID" if self.is_valid else "INVALID"
        return (
            f"mean={self.energy_mean:.4f} J  std={self.energy_std:.4f} J  "
            f"temp_before={self.avg_temperature_before:.1f} °C  "
            f"temp_after={self.avg_temperature_after:.1f} °C  [{tag}]"
        )

    def __str__(self) -> str:
        """Both durations and the statistics on one line (the trials left out)."""
        return (
            f"measurement={self.measurement_duration:.1f} s  "
            f"cooldown={self.cooldown_duration:.1f} s  {self._figures()}"
        )


@dataclass
class SweepReport:
    """What `profile_measurement_duration` or `profile_cooldown_duration` found.

    Attributes:
        sweep_param: `(name, values)` of the swept duration: `"measurement_duration"` or
            `"cooldown_duration"` and the values in the order swept.
        fixed_param: `(name, value)` of the duration held fixed.
        entries: One `SweepResult` per swept value, in the same order.

    """

    sweep_param: tuple[str, list[float]]
    fixed_param: tuple[str, float]
    entries: list[SweepResult]

    def __str__(self) -> str:
        """A header naming the fixed duration, then one line per swept value."""
        swept, _ = self.sweep_param
        fixed, fixed_value = self.fixed_param
        labels = [f"{swept}={getattr(e, swept):.1f} s" for e in self.entries]
        width = max((len(label) for label in labels), default=0)
        lines = [f"Sweep {swept} (fixed {fixed}={fixed_value:.1f} s):"]
        lines += [f"  {label:<{width}}  {e._figures()}" for label, e in zip(labels, self.entries)]
        return "\n".join(lines)


# Argument checks. Each names the argument and the value it got.


def _count(name: str, value: int, minimum: int) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r}: expected an integer") from None
    if n < minimum:
        raise ValueError(f"{name}={value!r}: must be at least {minimum}")
    return n


def _seconds(name: str, value: float, allow_zero: bool) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}={value!r}: expected a number of seconds") from None
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        bound = "at least 0" if allow_zero else "greater than 0"
        raise ValueError(f"{name}={value!r}: must be a finite number of seconds {bound}")
    return x


def _search_range(name: str, values: Sequence[float] | None, allow_zero: bool) -> list[float]:
    if values is None:
        return list(_DEFAULT_SEARCH_RANGE)
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name}={values!r}: expected a list of seconds")
    values = list(values)
    if not values:
        raise ValueError(
            f"{name}={values!r}: the search range is empty; "
            "pass None for the default [1.0, 2.0, ..., 10.0]"
        )
    return [_seconds(f"{name}[{i}]", v, allow_zero) for i, v in enumerate(values)]


def _threshold(value: float) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"trial_stddev_threshold={value!r}: expected a number") from None
    if not (math.isfinite(x) and x > 0):
        raise ValueError(
            f"trial_stddev_threshold={value!r}: must be a finite number of joules greater than 0"
        )
    return x


def _check_target(target_function: Callable[[], Any], zeus_monitor: ZeusMonitor) -> GPUs:
    """Check the two common arguments; return the monitor's GPUs."""
    if not callable(target_function):
        raise TypeError(f"target_function={target_function!r}: expected a callable")
    gpus = getattr(zeus_monitor, "gpus", None)
    if gpus is None or not getattr(zeus_monitor, "gpu_indices", None):
        raise ValueError(
            f"zeus_monitor={zeus_monitor!r} monitors no GPU; profiling reads GPU temperature, "
            "so create it with gpu_indices naming at least one GPU"
        )
    return gpus


# Time on the GPU backend's clock: real time, or the simulator's virtual clock.


def _now(gpus: GPUs) -> float:
    return gpus.now() if gpus.virtual_clock else time.monotonic()


def _idle(gpus: GPUs, seconds: float) -> None:
    if gpus.virtual_clock:
        import zeus.device.sim

        zeus.device.sim.advance(seconds)
    else:
        time.sleep(seconds)


def _mean_temperature(zeus_monitor: ZeusMonitor, gpus: GPUs) -> float:
    temps = [gpus.get_gpu_temperature(i) for i in zeus_monitor.gpu_indices]
    return sum(temps) / len(temps)


def _cancel(zeus_monitor: ZeusMonitor, key: str) -> None:
    """Close `key` unmeasured after the target raised, so the monitor stays usable."""
    try:
        zeus_monitor.end_window(key, sync_cuda=False, cancel=True)
    except Exception:  # the target's exception is the one to report
        pass


def _calibrate_iteration_duration(
    target_function: Callable[[], Any],
    zeus_monitor: ZeusMonitor,
    gpus: GPUs,
    num_warmup_iterations: int,
    num_calibration_iterations: int,
) -> float:
    """Warm up, then time `num_calibration_iterations` calls; seconds per call.

    The timed calls sit between the monitor's window syncs, so queued GPU work is counted.
    """
    for _ in range(num_warmup_iterations):
        target_function()
    zeus_monitor.begin_window(_CALIBRATION_WINDOW)
    start = _now(gpus)
    try:
        for _ in range(num_calibration_iterations):
            target_function()
    except BaseException:
        _cancel(zeus_monitor, _CALIBRATION_WINDOW)
        raise
    zeus_monitor.end_window(_CALIBRATION_WINDOW, cancel=True)
    elapsed = _now(gpus) - start
    [iteration_duration] = framework.all_reduce([elapsed / num_calibration_iterations], "max")
    if not iteration_duration > 0:
        raise RuntimeError(
            f"target_function took no measurable time over {num_calibration_iterations} "
            "calibration iterations; pass iteration_duration or raise num_calibration_iterations"
        )
    if framework.rank() == 0:
        logger.info("Calibrated iteration duration: %.3f ms", iteration_duration * 1000)
    return iteration_duration


def _run_trial(
    target_function: Callable[[], Any],
    zeus_monitor: ZeusMonitor,
    gpus: GPUs,
    cooldown_duration: float,
    measurement_duration: float,
    num_warmup_iterations: int,
    iteration_duration: float,
) -> TrialResult:
    """Idle for the cooldown, warm up, then measure about `measurement_duration` of calls."""
    iterations = max(1, int(measurement_duration / iteration_duration))
    if cooldown_duration > 0:
        _idle(gpus, cooldown_duration)
    before = _mean_temperature(zeus_monitor, gpus)
    for _ in range(num_warmup_iterations):
        target_function()
    zeus_monitor.begin_window(_TRIAL_WINDOW)
    try:
        for _ in range(iterations):
            target_function()
    except BaseException:
        _cancel(zeus_monitor, _TRIAL_WINDOW)
        raise
    m = zeus_monitor.end_window(_TRIAL_WINDOW)
    after = _mean_temperature(zeus_monitor, gpus)

    energy, bound, before_sum, after_sum = framework.all_reduce(
        [m.total_energy, m.total_energy_uncertainty, before, after], "sum"
    )
    [elapsed] = framework.all_reduce([m.time], "max")
    ranks = framework.world_size()
    return TrialResult(
        energy_per_iter=energy / iterations,
        time_per_iter=elapsed / iterations,
        total_energy=energy,
        total_time=elapsed,
        iterations=iterations,
        temperature_before=before_sum / ranks,
        temperature_after=after_sum / ranks,
        total_energy_uncertainty=bound,
    )


def _summarize(
    measurement_duration: float,
    cooldown_duration: float,
    trials: list[TrialResult],
    trial_stddev_threshold: float,
) -> SweepResult:
    energies = [t.energy_per_iter for t in trials]
    std = statistics.stdev(energies) if len(energies) > 1 else 0.0
    return SweepResult(
        measurement_duration=measurement_duration,
        cooldown_duration=cooldown_duration,
        trials=trials,
        energy_mean=statistics.fmean(energies),
        energy_std=std,
        avg_temperature_before=statistics.fmean(t.temperature_before for t in trials),
        avg_temperature_after=statistics.fmean(t.temperature_after for t in trials),
        avg_total_time=statistics.fmean(t.total_time for t in trials),
        avg_total_energy=statistics.fmean(t.total_energy for t in trials),
        is_valid=std < trial_stddev_threshold,
    )


def _sweep(
    target_function: Callable[[], Any],
    zeus_monitor: ZeusMonitor,
    gpus: GPUs,
    sweep_type: _SweepType,
    values: list[float],
    fixed_value: float,
    num_trials: int,
    num_warmup_trials: int,
    trial_stddev_threshold: float,
    num_warmup_iterations: int,
    iteration_duration: float,
) -> SweepReport:
    """Warm-up trials, then `num_trials` trials per value of the swept duration."""
    sweeps_cooldown = sweep_type == "cooldown_duration"
    fixed_type = "measurement_duration" if sweeps_cooldown else "cooldown_duration"
    rank_zero = framework.rank() == 0
    if rank_zero:
        logger.info("Sweeping %s (%s fixed at %.1f s)", sweep_type, fixed_type, fixed_value)

    # Warm-up trials only heat the GPU: no cooldown, no warm-up calls, the longest window.
    warmup_window = fixed_value if sweeps_cooldown else max(values)
    for i in range(num_warmup_trials):
        _run_trial(target_function, zeus_monitor, gpus, 0.0, warmup_window, 0, iteration_duration)
        if rank_zero:
            logger.info("Warm-up trial %d/%d done", i + 1, num_warmup_trials)

    entries: list[SweepResult] = []
    for value in values:
        cooldown = value if sweeps_cooldown else fixed_value
        window = fixed_value if sweeps_cooldown else value
        if rank_zero:
            logger.info("%s=%.1f s: %d trial(s)", sweep_type, value, num_trials)
        trials = []
        for i in range(num_trials):
            trials.append(
                _run_trial(
                    target_function,
                    zeus_monitor,
                    gpus,
                    cooldown,
                    window,
                    num_warmup_iterations,
                    iteration_duration,
                )
            )
            if rank_zero:
                logger.info("Trial %d/%d done", i + 1, num_trials)
        entries.append(_summarize(window, cooldown, trials, trial_stddev_threshold))

    report = SweepReport(
        sweep_param=(sweep_type, list(values)),
        fixed_param=(fixed_type, fixed_value),
        entries=entries,
    )
    if rank_zero:
        logger.info("%s", report)
    return report


def _run_sweep(
    sweep_type: _SweepType,
    target_function: Callable[[], Any],
    zeus_monitor: ZeusMonitor,
    search_range: Sequence[float] | None,
    fixed_value: float,
    num_trials: int,
    num_warmup_trials: int,
    trial_stddev_threshold: float,
    num_warmup_iterations: int,
    num_calibration_iterations: int,
    iteration_duration: float | None,
) -> SweepReport:
    """Check the arguments of a one-duration sweep, calibrate if needed, and sweep."""
    gpus = _check_target(target_function, zeus_monitor)
    sweeps_cooldown = sweep_type == "cooldown_duration"
    fixed_type = "measurement_duration" if sweeps_cooldown else "cooldown_duration"
    values = _search_range(f"{sweep_type}_search_range", search_range, sweeps_cooldown)
    fixed = _seconds(fixed_type, fixed_value, not sweeps_cooldown)
    num_trials = _count("num_trials", num_trials, 1)
    num_warmup_trials = _count("num_warmup_trials", num_warmup_trials, 0)
    threshold = _threshold(trial_stddev_threshold)
    num_warmup_iterations = _count("num_warmup_iterations", num_warmup_iterations, 0)
    num_calibration_iterations = _count("num_calibration_iterations", num_calibration_iterations, 1)
    if iteration_duration is None:
        iteration_duration = _calibrate_iteration_duration(
            target_function,
            zeus_monitor,
            gpus,
            num_warmup_iterations,
            num_calibration_iterations,
        )
    else:
        iteration_duration = _seconds("iteration_duration", iteration_duration, False)
    return _sweep(
        target_function,
        zeus_monitor,
        gpus,
        sweep_type,
        values,
        fixed,
        num_trials,
        num_warmup_trials,
        threshold,
        num_warmup_iterations,
        iteration_duration,
    )


def profile_measurement_duration(
    target_function: Callable[[], Any],
    zeus_monitor: ZeusMonitor,
    measurement_duration_search_range: list[float] | None = None,
    cooldown_duration: float = 10.0,
    num_trials: int = 10,
    num_warmup_trials: int = 2,
    trial_stddev_threshold: float = 0.01,
    num_warmup_iterations: int = 10,
    num_calibration_iterations: int = 100,
    iteration_duration: float | None = None,
) -> SweepReport:
    """Sweep the measurement duration with a fixed cooldown.

    Args:
        target_function: One iteration of the workload, called with no arguments.
        zeus_monitor: The monitor measuring it (its GPUs, and its CPUs if any).
        measurement_duration_search_range: Measurement durations to try, in seconds, each
            greater than 0; `None` is `[1.0, 2.0, ..., 10.0]`.
        cooldown_duration: Idle time before every trial, in seconds (0 for none).
        num_trials: Trials per measurement duration.
        num_warmup_trials: Throw-away trials before the sweep, to bring the GPU to its
            working temperature.
        trial_stddev_threshold: A duration is valid when the sample standard deviation of its
            trials' energy per iteration is below this many joules.
        num_warmup_iterations: Unmeasured calls before each trial's window (and before
            calibration).
        num_calibration_iterations: Timed calls that calibrate the time of one call.
        iteration_duration: The time of one call in seconds, if known; `None` calibrates it.

    Returns:
        The report, one entry per measurement duration in the order given.

    Raises:
        ValueError: An empty search range, a non-positive duration, `num_trials` below 1, a
            negative count, a non-positive threshold, or a monitor without GPUs (the message
            names the argument and its value).

    """
    return _run_sweep(
        "measurement_duration",
        target_function,
        zeus_monitor,
        measurement_duration_search_range,
        cooldown_duration,
        num_trials,
        num_warmup_trials,
        trial_stddev_threshold,
        num_warmup_iterations,
        num_calibration_iterations,
        iteration_duration,
    )


def profile_cooldown_duration(
    target_function: Callable[[], Any],
    zeus_monitor: ZeusMonitor,
    cooldown_duration_search_range: list[float] | None = None,
    measurement_duration: float = 10.0,
    num_trials: int = 10,
    num_warmup_trials: int = 2,
    trial_stddev_threshold: float = 0.01,
    num_warmup_iterations: int = 10,
    num_calibration_iterations: int = 100,
    iteration_duration: float | None = None,
) -> SweepReport:
    """Sweep the cooldown duration with a fixed measurement duration.

    Args:
        target_function: One iteration of the workload, called with no arguments.
        zeus_monitor: The monitor measuring it (its GPUs, and its CPUs if any).
        cooldown_duration_search_range: Cooldown durations to try, in seconds, each at least
            0; `None` is `[1.0, 2.0, ..., 10.0]`.
        measurement_duration: Length of every trial's measured window, in seconds.
        num_trials: Trials per cooldown duration.
        num_warmup_trials: Throw-away trials before the sweep, to bring the GPU to its
            working temperature.
        trial_stddev_threshold: A duration is valid when the sample standard deviation of its
            trials' energy per iteration is below this many joules.
        num_warmup_iterations: Unmeasured calls before each trial's window (and before
            calibration).
        num_calibration_iterations: Timed calls that calibrate the time of one call.
        iteration_duration: The time of one call in seconds, if known; `None` calibrates it.

    Returns:
        The report, one entry per cooldown duration in the order given.

    Raises:
        ValueError: An empty search range, a negative cooldown, a non-positive measurement
            duration, `num_trials` below 1, a negative count, a non-positive threshold, or a
            monitor without GPUs (the message names the argument and its value).

    """
    return _run_sweep(
        "cooldown_duration",
        target_function,
        zeus_monitor,
        cooldown_duration_search_range,
        measurement_duration,
        num_trials,
        num_warmup_trials,
        trial_stddev_threshold,
        num_warmup_iterations,
        num_calibration_iterations,
        iteration_duration,
    )


def profile_parameters(
    target_function: Callable[[], Any],
    zeus_monitor: ZeusMonitor,
    measurement_duration_search_range: list[float] | None = None,
    cooldown_duration_search_range: list[float] | None = None,
    num_trials: int = 10,
    num_warmup_trials: int = 2,
    trial_stddev_threshold: float = 0.01,
    num_warmup_iterations: int = 10,
    num_calibration_iterations: int = 100,
) -> tuple[SweepReport, SweepReport]:
    """Sweep both durations: first the measurement duration, then the cooldown duration.

    The call time is calibrated once. The measurement sweep holds the cooldown at the longest
    value of `cooldown_duration_search_range` and runs the warm-up trials; the cooldown sweep
    then holds the measurement duration at the longest value of
    `measurement_duration_search_range`, with no further warm-up trials.

    Args:
        target_function: One iteration of the workload, called with no arguments.
        zeus_monitor: The monitor measuring it (its GPUs, and its CPUs if any).
        measurement_duration_search_range: Measurement durations to try, in seconds, each
            greater than 0; `None` is `[1.0, 2.0, ..., 10.0]`.
        cooldown_duration_search_range: Cooldown durations to try, in seconds, each at least
            0; `None` is `[1.0, 2.0, ..., 10.0]`.
        num_trials: Trials per swept value.
        num_warmup_trials: Throw-away trials before the first sweep, to bring the GPU to its
            working temperature.
        trial_stddev_threshold: A duration is valid when the sample standard deviation of its
            trials' energy per iteration is below this many joules.
        num_warmup_iterations: Unmeasured calls before each trial's window (and before
            calibration).
        num_calibration_iterations: Timed calls that calibrate the time of one call.

    Returns:
        `(measurement_duration_report, cooldown_duration_report)`.

    Raises:
        ValueError: As `profile_measurement_duration` and `profile_cooldown_duration`; every
            argument is checked before the target is first called.

    """
    gpus = _check_target(target_function, zeus_monitor)
    m_range = _search_range(
        "measurement_duration_search_range", measurement_duration_search_range, False
    )
    c_range = _search_range("cooldown_duration_search_range", cooldown_duration_search_range, True)
    _count("num_trials", num_trials, 1)
    _count("num_warmup_trials", num_warmup_trials, 0)
    _threshold(trial_stddev_threshold)
    num_warmup_iterations = _count("num_warmup_iterations", num_warmup_iterations, 0)
    num_calibration_iterations = _count("num_calibration_iterations", num_calibration_iterations, 1)
    iteration_duration = _calibrate_iteration_duration(
        target_function, zeus_monitor, gpus, num_warmup_iterations, num_calibration_iterations
    )
    measurement_report = profile_measurement_duration(
        target_function,
        zeus_monitor,
        measurement_duration_search_range=m_range,
        cooldown_duration=max(c_range),
        num_trials=num_trials,
        num_warmup_trials=num_warmup_trials,
        trial_stddev_threshold=trial_stddev_threshold,
        num_warmup_iterations=num_warmup_iterations,
        iteration_duration=iteration_duration,
    )
    cooldown_report = profile_cooldown_duration(
        target_function,
        zeus_monitor,
        cooldown_duration_search_range=c_range,
        measurement_duration=max(m_range),
        num_trials=num_trials,
        num_warmup_trials=0,
        trial_stddev_threshold=trial_stddev_threshold,
        num_warmup_iterations=num_warmup_iterations,
        iteration_duration=iteration_duration,
    )
    return measurement_report, cooldown_report


def measure(
    target_function: Callable[[], Any],
    zeus_monitor: ZeusMonitor,
    measurement_duration: float,
    cooldown_duration: float,
    num_warmup_iterations: int = 10,
    num_calibration_iterations: int = 100,
) -> TrialResult:
    """Measure one trial: calibrate the call time, idle, warm up, then measure.

    Args:
        target_function: One iteration of the workload, called with no arguments.
        zeus_monitor: The monitor measuring it (its GPUs, and its CPUs if any).
        measurement_duration: About how long the measured window runs, in seconds (at least
            one call is measured).
        cooldown_duration: Idle time before the warm-up calls, in seconds (0 for none).
        num_warmup_iterations: Unmeasured calls before calibration and again before the
            measured window.
        num_calibration_iterations: Timed calls that calibrate the time of one call.

    Returns:
        The trial's energy and time, per call and in total, and the GPU temperatures.

    Raises:
        ValueError: A non-positive `measurement_duration`, a negative `cooldown_duration`, a
            negative `num_warmup_iterations`, `num_calibration_iterations` below 1, or a
            monitor without GPUs (the message names the argument and its value).

    """
    gpus = _check_target(target_function, zeus_monitor)
    measurement_duration = _seconds("measurement_duration", measurement_duration, False)
    cooldown_duration = _seconds("cooldown_duration", cooldown_duration, True)
    num_warmup_iterations = _count("num_warmup_iterations", num_warmup_iterations, 0)
    num_calibration_iterations = _count("num_calibration_iterations", num_calibration_iterations, 1)
    iteration_duration = _calibrate_iteration_duration(
        target_function, zeus_monitor, gpus, num_warmup_iterations, num_calibration_iterations
    )
    return _run_trial(
        target_function,
        zeus_monitor,
        gpus,
        cooldown_duration,
        measurement_duration,
        num_warmup_iterations,
        iteration_duration,
    )
