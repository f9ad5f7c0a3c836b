"""EarlyStopController: validation, epoch budget, cost budget (simulated GPUs), target metric."""

from __future__ import annotations

import pytest
import zeus.device.sim
from zeus.controller import EarlyStopController
from zeus.util.metric import zeus_cost


class SimMonitor:
    """Windows over the simulated GPUs (time from the GPUs' clock, energy counters in J)."""

    def __init__(self, gpus, gpu_indices):
        self.gpus, self.gpu_indices, self.open = gpus, list(gpu_indices), {}

    def begin_window(self, key: str, sync_cuda: bool = True) -> None:
        e = {i: self.gpus.get_total_energy_consumption(i) for i in self.gpu_indices}
        self.open[key] = (self.gpus.now(), e)

    def end_window(self, key: str, sync_cuda: bool = True, cancel: bool = False):
        t0, e0 = self.open.pop(key)
        e1 = {i: self.gpus.get_total_energy_consumption(i) for i in self.gpu_indices}

        class M:
            time = self.gpus.now() - t0
            energy = {i: (e1[i] - e0[i]) / 1000 for i in self.gpu_indices}

        return M()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_epochs": 0}, "max_epochs.*0"),
        ({"cost_threshold": -1.0, "monitor": object()}, "cost_threshold.*-1"),
        ({"cost_threshold": 10.0}, "together"),
        ({"monitor": object()}, "together"),
        ({"target_metric": 0.9}, "together"),
        ({"higher_is_better": True}, "together"),
        ({"eta_knob": 1.2}, "eta_knob.*1.2"),
    ],
)
def test_bad_arguments(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        EarlyStopController(**kwargs)


def test_max_epochs() -> None:
    c = EarlyStopController(max_epochs=3)
    for _ in range(2):
        c.on_epoch_begin()
        c.on_epoch_end()
        assert not c.should_training_stop
    c.on_epoch_begin()
    c.on_epoch_end()
    assert c.should_training_stop


@pytest.mark.parametrize(
    ("higher", "metrics", "stop_at"), [(True, [0.5, 0.8, 0.91], 2), (False, [3.0, 2.0, 1.0], 2)]
)
def test_target_metric(higher: bool, metrics: list[float], stop_at: int) -> None:
    c = EarlyStopController(target_metric=0.9 if higher else 1.0, higher_is_better=higher)
    for i, m in enumerate(metrics):
        c.on_evaluate(m)
        assert c.should_training_stop == (i >= stop_at)
    c.on_evaluate(metrics[0])
    assert c.should_training_stop  # sticky


def test_cost_threshold_predicts_the_next_epoch(sim_gpus) -> None:
    gpus = sim_gpus("A40,V100")
    zeus.device.sim.set_busy(0)
    zeus.device.sim.set_busy(1)
    mon = SimMonitor(gpus, [0, 1])
    # One epoch = 10 s busy. Cost of an epoch, computed independently from the simulator's
    # steady state: sum over GPUs of eta*E + (1-eta)*maxP*T.
    per_epoch = 0.0
    for i, maxp in ((0, 300), (1, 250)):
        _, watts = zeus.device.sim.steady_state(i)
        per_epoch += zeus_cost(watts * 10, 10, 0.5, maxp)
    # Stop when spent + mean >= threshold: after epoch k, that is (k+1)*per_epoch.
    c = EarlyStopController(monitor=mon, eta_knob=0.5, cost_threshold=3.5 * per_epoch)
    assert c.max_power == {0: 300, 1: 250}
    stopped_after = None
    for epoch in range(1, 6):
        c.on_epoch_begin()
        zeus.device.sim.advance(10.0)
        c.on_epoch_end()
        if c.should_training_stop:
            stopped_after = epoch
            break
    assert stopped_after == 3
    assert c.epoch_costs == pytest.approx([per_epoch] * 3, rel=1e-3)
