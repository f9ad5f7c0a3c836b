"""End to end: the optimizer on simulated GPUs whose workload curve comes from the Zeus A40 power
trace, on the virtual clock. It must choose what the selector chooses on the curve itself."""

from __future__ import annotations

import csv
from typing import Callable

import pytest
import zeus.device.sim
from plo_helpers import TRACE_DIR, WindowMonitor
from zeus.optimizer.power_limit import (
    Done,
    GlobalPowerLimitOptimizer,
    MaxSlowdownConstraint,
    OptimumSelector,
    Time,
    ZeusCost,
)

CONFIGS = [
    ("imagenet", "resnet50", "256"),
    ("cifar100", "shufflenetv2", "1024"),
    ("librispeech", "deepspeech2", "64"),
]
WORK_PER_STEP = 1e-3  # of an epoch of the trace
STEPS_PER_EPOCH = {"never": 100_000, "warmup": 14, "profiling": 20, "irregular": 0}


def curve(dataset: str, network: str, batch_size: str) -> list[tuple[float, float, float]]:
    path = TRACE_DIR / "summary_power_a40.csv"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    with open(path, newline="") as f:
        rows = [
            (float(r["power_limit"]), float(r["time_per_epoch"]), float(r["average_power"]))
            for r in csv.DictReader(f)
            if (r["dataset"], r["network"], r["batch_size"]) == (dataset, network, batch_size)
        ]
    assert rows, (dataset, network, batch_size)
    return sorted(rows)


def expected(points: list[tuple[float, float, float]], selector: str, world: int) -> int:
    """The selector applied to the curve, highest limit first, in plain Python.

    A GPU never draws more than its power limit, so the simulator caps the curve's average
    power there (the trace has a few points slightly above their limit).
    """
    prof = [(int(p), t * min(a, p) * world, t) for p, t, a in sorted(points, reverse=True)]
    if selector.startswith("zeus"):
        eta = float(selector.split(":")[1])
        max_power = prof[0][0] * world
        costs = [eta * e + (1 - eta) * max_power * t for _, e, t in prof]
        return prof[costs.index(min(costs))][0]
    if selector == "time":
        times = [t for _, _, t in prof]
        return prof[times.index(min(times))][0]
    factor = float(selector.split(":")[1])
    return min(pl for pl, _, t in prof if t <= factor * prof[0][2])


def build(selector: str, world: int) -> OptimumSelector:
    if selector.startswith("zeus"):
        return ZeusCost(float(selector.split(":")[1]), world)
    if selector == "time":
        return Time()
    return MaxSlowdownConstraint(float(selector.split(":")[1]))


@pytest.mark.parametrize("pattern", list(STEPS_PER_EPOCH))
@pytest.mark.parametrize("selector", ["zeus:0.5", "zeus:1.0", "time", "slowdown:1.1"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(c))
def test_chooses_the_curves_optimum(
    config: tuple[str, str, str],
    selector: str,
    pattern: str,
    sim_gpus: Callable[..., object],
) -> None:
    points = curve(*config)
    gpus = sim_gpus("A40,A40")
    for i in range(2):
        zeus.device.sim.set_workload(i, points)
    monitor = WindowMonitor(gpus, [0, 1])
    plo = GlobalPowerLimitOptimizer(
        monitor, build(selector, 2), wait_steps=1, warmup_steps=3, profile_steps=8
    )
    epoch = 0
    while not isinstance(plo.state, Done):
        assert epoch < 200, plo.state
        # "irregular": epochs of 5, 9, 13, ... steps end in every kind of state.
        n = STEPS_PER_EPOCH[pattern] or 5 + 4 * (epoch % 5)
        plo.on_epoch_begin()
        for _ in range(n):
            plo.on_step_begin()
            zeus.device.sim.run(WORK_PER_STEP)
            plo.on_step_end()
            if isinstance(plo.state, Done):
                break
        plo.on_epoch_end()
        epoch += 1

    want = expected(points, selector, 2)
    assert plo.state.optimal_power_limit == want * 1000
    assert gpus.get_power_management_limit(0) == gpus.get_power_management_limit(1) == want * 1000
    # Each limit was measured once, over `profile_steps` steps at the curve's speed (up to the
    # float resolution of epoch-second timestamps).
    assert [m.power_limit for m in plo.measurements] == [
        300,
        275,
        250,
        225,
        200,
        175,
        150,
        125,
        100,
    ]
    by_pl = {int(p): t for p, t, _ in points}
    for m in plo.measurements:
        assert m.time == pytest.approx(8 * WORK_PER_STEP * by_pl[m.power_limit], rel=1e-4)
    if pattern != "never":
        assert epoch > 1


def test_with_the_real_zeus_monitor(sim_gpus: Callable[..., object]) -> None:
    """Same end-to-end check through `zeus.monitor.ZeusMonitor` (energy counters in Rust)."""
    from zeus.monitor import ZeusMonitor

    points = curve("imagenet", "resnet50", "256")
    sim_gpus("A40")
    zeus.device.sim.set_workload(0, points)
    plo = GlobalPowerLimitOptimizer(
        ZeusMonitor(gpu_indices=[0]), ZeusCost(0.5), wait_steps=1, warmup_steps=3, profile_steps=8
    )
    for epoch in range(100):
        plo.on_epoch_begin()
        for _ in range(5 + 4 * (epoch % 5)):
            plo.on_step_begin()
            zeus.device.sim.run(WORK_PER_STEP)
            plo.on_step_end()
        plo.on_epoch_end()
        if isinstance(plo.state, Done):
            break
    assert isinstance(plo.state, Done)
    assert plo.state.optimal_power_limit == expected(points, "zeus:0.5", 1) * 1000
    by_pl = {int(p): (t, a) for p, t, a in points}
    for m in plo.measurements:
        t, a = by_pl[m.power_limit]
        assert m.time == pytest.approx(8 * WORK_PER_STEP * t, rel=1e-4)
        watts = min(a, m.power_limit)  # capped at the limit, as in `expected`
        assert m.energy == pytest.approx(8 * WORK_PER_STEP * t * watts, rel=1e-3)
