"""Properties of the optimizer's state machine for any step counts and epoch lengths."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import zeus.device.sim
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plo_helpers import dedupe
from zeus.device import get_gpus
from zeus.device.settings import restore_all
from zeus.optimizer.power_limit import Done, GlobalPowerLimitOptimizer
from zeus.optimizer.power_limit.optimizer import _WINDOW_PREFIX


@dataclass
class Win:
    time: float
    energy: dict[int, float]

    @property
    def total_energy(self) -> float:
        return sum(self.energy.values())


@dataclass
class StepCountingMonitor:
    """Measures in steps: time = steps in the window, energy = steps x a made-up watt curve."""

    gpu_indices: list[int]
    step: int = 0
    limit_w: int = 0
    open: dict[str, int] = field(default_factory=dict)
    closed: list[tuple[str, int]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def begin_window(self, key: str, sync_cuda: bool = True) -> None:
        assert key not in self.open
        self.open[key] = self.step

    def end_window(self, key: str, sync_cuda: bool = True, cancel: bool = False) -> Win:
        steps = self.step - self.open.pop(key)
        if cancel:
            self.cancelled.append(key)
            return Win(0.0, {i: 0.0 for i in self.gpu_indices})
        self.closed.append((key, steps))
        pl = int(key[len(_WINDOW_PREFIX) :])
        # Energy per step is lowest at 175 W: a distinct optimum for the Energy selector.
        per_step = 1.0 + ((pl - 175) / 100) ** 2
        return Win(float(steps), {i: steps * per_step for i in self.gpu_indices})


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    wait=st.integers(0, 4),
    warmup=st.integers(0, 4),
    profile=st.integers(1, 5),
    pl_step=st.sampled_from([25, 30, 50, 70, 200]),
    epoch_lengths=st.lists(st.integers(1, 30), min_size=1, max_size=8),
)
def test_state_machine_invariants(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
    set_calls: list[tuple[int, int]],
    wait: int,
    warmup: int,
    profile: int,
    pl_step: int,
    epoch_lengths: list[int],
) -> None:
    from zeus.optimizer.power_limit import Energy

    monkeypatch.setenv("ZEUS_GPU_BACKEND", "sim")
    monkeypatch.setenv("ZEUS_SIM_GPUS", "A40,A40")
    monkeypatch.setenv("ZEUS_SIM_CLOCK", "virtual")
    monkeypatch.setenv("ZEUS_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    zeus.device.sim.reset()
    calls = set_calls  # shared by the examples of one test run
    calls.clear()

    mon = StepCountingMonitor([0, 1])
    plo = GlobalPowerLimitOptimizer(
        mon, Energy(), wait_steps=wait, warmup_steps=warmup, profile_steps=profile, pl_step=pl_step
    )
    try:
        # The given epochs, then long enough epochs to finish.
        lengths = epoch_lengths + [warmup + profile + 2] * (2 * len(plo.power_limits) + 2)
        for n in lengths:
            plo.on_epoch_begin()
            for _ in range(n):
                mon.step += 1
                plo.on_step_begin()
                plo.on_step_end()
            plo.on_epoch_end()
            # An epoch end never leaves a measurement window open.
            assert mon.open == {}
        assert isinstance(plo.state, Done)

        pls = plo.power_limits
        assert pls == sorted(pls, reverse=True) and pls[0] == 300_000
        assert min(pls) >= 100_000 and min(pls) - pl_step * 1000 < 100_000
        # Every limit measured exactly once, in order, over exactly `profile` steps.
        assert [m.power_limit * 1000 for m in plo.measurements] == pls
        assert [s for _, s in mon.closed] == [profile] * len(pls)
        assert plo.state == Done(
            optimal_power_limit=min(pls, key=lambda p: (1.0 + ((p // 1000 - 175) / 100) ** 2, -p))
        )
        # Both GPUs always get the same limits; no limit is set twice in a row; every limit
        # set is the maximum, a profiled one, or the optimum.
        seq = [mw for i, mw in calls if i == 0]
        assert seq == [mw for i, mw in calls if i == 1]
        assert seq == dedupe(seq)
        assert set(seq) <= set(pls)
        assert seq[-1] == plo.state.optimal_power_limit
        assert get_gpus().get_power_management_limit(0) == plo.state.optimal_power_limit
    finally:
        restore_all()
