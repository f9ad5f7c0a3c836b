"""`zeus.profile` on the simulated GPU's virtual clock, used as a Zeus 0.16 program uses it.

The workloads are `zeus.device.sim.run` calls: each advances the virtual clock by the time its
work takes and draws the simulated GPU's busy power meanwhile, and the profiler's cooldowns
advance the same clock, so every figure here is exact and independent of the machine's load.
"""

from __future__ import annotations

import logging
import math
import random
import re
from typing import Callable

import pytest
import zeus.device.sim as sim
from zeus.device import get_gpus
from zeus.monitor import ZeusMonitor
from zeus.profile import (
    SweepReport,
    SweepResult,
    TrialResult,
    measure,
    profile_cooldown_duration,
    profile_measurement_duration,
    profile_parameters,
)


class Workload:
    """One iteration is `work` units on every simulated GPU; calls are recorded.

    With `slowdown`, the GPU behaves thermally: it heats up while it works (time constant
    `tau_heat`) and cools while idle (`tau_cool`), and a hot GPU needs up to
    `1 + slowdown` times the time, hence the energy, for the same work.
    """

    def __init__(
        self,
        work: float = 0.01,
        jitter: float = 0.0,
        slowdown: float = 0.0,
        tau_heat: float = 20.0,
        tau_cool: float = 2.0,
        seed: int = 0,
    ) -> None:
        self.work, self.jitter, self.slowdown = work, jitter, slowdown
        self.tau_heat, self.tau_cool = tau_heat, tau_cool
        self.rng = random.Random(seed)
        self.heat = 0.0
        self.starts: list[float] = []
        self.ends: list[float] = []

    def __call__(self) -> None:
        now = sim.now()
        if self.ends:
            self.heat *= math.exp(-(now - self.ends[-1]) / self.tau_cool)
        work = self.work * (1 + self.jitter * self.rng.random()) * (1 + self.slowdown * self.heat)
        self.starts.append(now)
        seconds = sim.run(work)
        self.heat = 1 - (1 - self.heat) * math.exp(-seconds / self.tau_heat)
        self.ends.append(sim.now())

    @property
    def calls(self) -> int:
        return len(self.starts)

    def idle_gaps(self) -> list[float]:
        """Idle time before each call after the first."""
        return [start - end for start, end in zip(self.starts[1:], self.ends)]


@pytest.fixture
def monitor(sim_gpus: Callable[..., object]) -> ZeusMonitor:
    sim_gpus("A40", clock="virtual")
    return ZeusMonitor(gpu_indices=[0])


def busy_power(index: int = 0) -> float:
    return sim.steady_state(index)[1]


def test_measure_reports_energy_and_time_per_iteration(monitor: ZeusMonitor) -> None:
    idle_temperature = get_gpus().get_gpu_temperature(0)
    target = Workload(work=0.01)
    trial = measure(target, monitor, measurement_duration=1.0, cooldown_duration=5.0)

    assert isinstance(trial, TrialResult)
    assert trial.iterations in (99, 100)  # 1 s of 10 ms calls (the clock's rounding aside)
    assert trial.time_per_iter == pytest.approx(0.01, rel=1e-5)
    assert trial.energy_per_iter == pytest.approx(busy_power() * 0.01, rel=1e-4)
    assert trial.total_energy == pytest.approx(trial.energy_per_iter * trial.iterations)
    assert trial.total_time == pytest.approx(trial.time_per_iter * trial.iterations)
    assert trial.total_energy_uncertainty >= 0
    # 10 warm-up and 100 calibration calls, the cooldown, 10 warm-up calls, the window.
    assert target.calls == 10 + 100 + 10 + trial.iterations
    gaps = target.idle_gaps()
    assert gaps[110 - 1] == pytest.approx(5.0)
    assert max(gaps[: 110 - 1] + gaps[110:]) < 1e-6
    # The temperature is read after the cooldown, when the GPU is idle again.
    assert trial.temperature_before == idle_temperature


def test_more_work_per_iteration_measures_more_energy(monitor: ZeusMonitor) -> None:
    light = measure(Workload(work=0.01), monitor, measurement_duration=1.0, cooldown_duration=1.0)
    heavy = measure(Workload(work=0.03), monitor, measurement_duration=1.0, cooldown_duration=1.0)

    assert heavy.energy_per_iter == pytest.approx(3 * light.energy_per_iter, rel=1e-4)
    assert heavy.time_per_iter == pytest.approx(3 * light.time_per_iter, rel=1e-5)
    assert heavy.iterations < light.iterations
    # The same window length at the same power: about the same total energy.
    assert heavy.total_energy == pytest.approx(light.total_energy, abs=heavy.energy_per_iter)


def test_two_gpus_add_energy_and_average_temperature(
    sim_gpus: Callable[..., object],
) -> None:
    sim_gpus("A40,A40", clock="virtual")
    gpus = get_gpus()
    idle = (gpus.get_gpu_temperature(0) + gpus.get_gpu_temperature(1)) / 2
    monitor = ZeusMonitor(gpu_indices=[0, 1])
    trial = measure(Workload(work=0.01), monitor, measurement_duration=1.0, cooldown_duration=1.0)

    assert trial.energy_per_iter == pytest.approx((busy_power(0) + busy_power(1)) * 0.01, rel=1e-4)
    assert trial.temperature_before == idle


def test_measurement_sweep_marks_the_stable_duration_valid(monitor: ZeusMonitor) -> None:
    # Each call takes 10-20 ms at random: a short window averages few calls and its energy
    # per call varies from trial to trial; a long one averages it out.
    target = Workload(work=0.01, jitter=1.0, seed=0)
    report = profile_measurement_duration(
        target,
        monitor,
        measurement_duration_search_range=[0.2, 10.0],
        cooldown_duration=1.0,
        num_trials=10,
        trial_stddev_threshold=0.05,
    )

    assert isinstance(report, SweepReport)
    assert report.sweep_param == ("measurement_duration", [0.2, 10.0])
    assert report.fixed_param == ("cooldown_duration", 1.0)
    short, long = report.entries
    assert isinstance(short, SweepResult)
    assert [e.measurement_duration for e in report.entries] == [0.2, 10.0]
    assert [e.cooldown_duration for e in report.entries] == [1.0, 1.0]
    assert len(short.trials) == len(long.trials) == 10
    assert not short.is_valid and long.is_valid
    assert long.energy_std < 0.05 < short.energy_std
    # Both estimate the same mean energy per call (15 ms of busy power).
    assert long.energy_mean == pytest.approx(busy_power() * 0.015, rel=0.05)
    assert long.avg_total_time == pytest.approx(10.0, rel=0.05)
    text = str(report)
    assert "fixed cooldown_duration=1.0 s" in text
    assert "[INVALID]" in text.splitlines()[1] and "[VALID]" in text.splitlines()[2]


def test_cooldown_sweep_marks_a_cooldown_that_lets_the_gpu_cool_valid(
    monitor: ZeusMonitor,
) -> None:
    idle_temperature = get_gpus().get_gpu_temperature(0)
    # The GPU cools with a 2 s time constant: after 0.5 s or 2 s idle it still holds heat
    # from the trials before, so trials drift; after 20 s every trial starts cold.
    target = Workload(work=0.01, slowdown=1.0)
    report = profile_cooldown_duration(
        target,
        monitor,
        cooldown_duration_search_range=[0.5, 2.0, 20.0],
        measurement_duration=1.0,
        num_trials=5,
    )

    assert report.sweep_param == ("cooldown_duration", [0.5, 2.0, 20.0])
    assert report.fixed_param == ("measurement_duration", 1.0)
    assert [e.is_valid for e in report.entries] == [False, False, True]
    assert report.entries[2].energy_std < 0.01 < min(e.energy_std for e in report.entries[:2])
    # Cold trials spend the least energy per call.
    assert report.entries[2].energy_mean < min(e.energy_mean for e in report.entries[:2])
    # Every trial of the last entry idled 20 s first, and the GPU was idle then.
    assert sum(gap == pytest.approx(20.0) for gap in target.idle_gaps()) == 5
    assert max(target.idle_gaps()) == pytest.approx(20.0)
    for entry in report.entries:
        assert entry.avg_temperature_before == idle_temperature
        assert all(t.temperature_before == idle_temperature for t in entry.trials)


def test_profile_parameters_with_defaults(monitor: ZeusMonitor) -> None:
    target = Workload(work=0.1)
    m_report, c_report = profile_parameters(target, monitor)

    defaults = [float(s) for s in range(1, 11)]
    assert m_report.sweep_param == ("measurement_duration", defaults)
    assert m_report.fixed_param == ("cooldown_duration", 10.0)
    assert c_report.sweep_param == ("cooldown_duration", defaults)
    assert c_report.fixed_param == ("measurement_duration", 10.0)
    entries = m_report.entries + c_report.entries
    assert all(len(e.trials) == 10 and e.is_valid for e in entries)
    assert all(e.energy_mean == pytest.approx(busy_power() * 0.1, rel=1e-4) for e in entries)
    # One calibration (10 warm-up and 100 timed calls), two warm-up trials of the longest
    # window before the first sweep only, then each trial's 10 warm-up calls and its window.
    longest = m_report.entries[-1].trials[0].iterations
    trial_calls = sum(t.iterations + 10 for e in entries for t in e.trials)
    assert target.calls == 110 + 2 * longest + trial_calls
    # The shortest valid durations, as Zeus's guide picks them.
    assert next(e.measurement_duration for e in m_report.entries if e.is_valid) == 1.0
    assert next(e.cooldown_duration for e in c_report.entries if e.is_valid) == 1.0


def test_given_iteration_duration_skips_calibration(monitor: ZeusMonitor) -> None:
    target = Workload(work=0.01)
    report = profile_measurement_duration(
        target,
        monitor,
        measurement_duration_search_range=[1.0],
        cooldown_duration=0.0,
        num_trials=2,
        num_warmup_trials=0,
        num_warmup_iterations=0,
        iteration_duration=0.05,
    )

    [entry] = report.entries
    assert [t.iterations for t in entry.trials] == [20, 20]
    assert target.calls == 40
    # The figures are measured, not derived from the given iteration duration.
    assert entry.trials[0].time_per_iter == pytest.approx(0.01, rel=1e-5)


def test_a_failing_target_leaves_the_monitor_usable(monitor: ZeusMonitor) -> None:
    workload = Workload(work=0.01)

    def flaky() -> None:
        if workload.calls == 150:  # inside the measured window
            raise RuntimeError("CUDA out of memory")
        workload()

    with pytest.raises(RuntimeError, match="out of memory"):
        measure(flaky, monitor, measurement_duration=1.0, cooldown_duration=0.0)
    assert monitor.measurement_states == {}
    trial = measure(workload, monitor, measurement_duration=1.0, cooldown_duration=0.0)
    assert trial.energy_per_iter == pytest.approx(busy_power() * 0.01, rel=1e-4)


def test_progress_is_logged(monitor: ZeusMonitor, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zeus.profile")
    profile_measurement_duration(
        Workload(work=0.01), monitor, [1.0], cooldown_duration=0.0, num_trials=2
    )
    text = caplog.text
    assert "Calibrated iteration duration" in text
    assert "Sweeping measurement_duration" in text
    assert "Sweep measurement_duration (fixed cooldown_duration=0.0 s)" in text


def _never_called() -> None:
    pytest.fail("the target ran although an argument was bad")


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (
            lambda m: profile_parameters(_never_called, m, []),
            "measurement_duration_search_range=[]",
        ),
        (
            lambda m: profile_parameters(_never_called, m, cooldown_duration_search_range=[]),
            "cooldown_duration_search_range=[]",
        ),
        (
            lambda m: profile_measurement_duration(_never_called, m, [1.0, 0.0]),
            "measurement_duration_search_range[1]=0.0",
        ),
        (
            lambda m: profile_cooldown_duration(_never_called, m, [-1.0]),
            "cooldown_duration_search_range[0]=-1.0",
        ),
        (
            lambda m: profile_cooldown_duration(_never_called, m, measurement_duration=0),
            "measurement_duration=0",
        ),
        (
            lambda m: profile_measurement_duration(_never_called, m, cooldown_duration=-2.0),
            "cooldown_duration=-2.0",
        ),
        (lambda m: profile_parameters(_never_called, m, num_trials=0), "num_trials=0"),
        (
            lambda m: profile_measurement_duration(_never_called, m, num_warmup_trials=-1),
            "num_warmup_trials=-1",
        ),
        (
            lambda m: profile_cooldown_duration(_never_called, m, trial_stddev_threshold=0.0),
            "trial_stddev_threshold=0.0",
        ),
        (
            lambda m: profile_parameters(_never_called, m, trial_stddev_threshold=float("nan")),
            "trial_stddev_threshold=nan",
        ),
        (
            lambda m: profile_measurement_duration(_never_called, m, iteration_duration=0.0),
            "iteration_duration=0.0",
        ),
        (lambda m: measure(_never_called, m, 0.0, 1.0), "measurement_duration=0.0"),
        (lambda m: measure(_never_called, m, 1.0, float("inf")), "cooldown_duration=inf"),
        (
            lambda m: measure(_never_called, m, 1.0, 1.0, num_warmup_iterations=-1),
            "num_warmup_iterations=-1",
        ),
        (
            lambda m: measure(_never_called, m, 1.0, 1.0, num_calibration_iterations=0),
            "num_calibration_iterations=0",
        ),
    ],
)
def test_bad_arguments_are_named(
    monitor: ZeusMonitor, call: Callable[[ZeusMonitor], object], named: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        call(monitor)
