"""The Zeus cost metric."""

from __future__ import annotations

from zeus._core.util import zeus_cost as _zeus_cost

__all__ = ["zeus_cost", "ZeusCostThresholdExceededError"]


def zeus_cost(energy: float, time: float, eta_knob: float, max_power: int | float) -> float:
    """Zeus's energy-time cost: `eta * energy + (1 - eta) * max_power * time`.

    Args:
        energy: Joules.
        time: Seconds.
        eta_knob: Weight of energy against time, in [0, 1] (not checked here).
        max_power: Maximum power of all GPUs together, watts; it turns time into joules.

    """
    return _zeus_cost(float(energy), float(time), float(eta_knob), float(max_power))


class ZeusCostThresholdExceededError(Exception):
    """The next epoch would push the cost past the threshold, so training stops.

    Attributes:
        time_consumed: Seconds spent so far.
        energy_consumed: Joules spent so far.
        cost: Cost so far.
        next_cost: Expected cost after one more epoch.
        cost_thresh: The threshold.

    """

    def __init__(
        self,
        time_consumed: float,
        energy_consumed: float,
        cost: float,
        next_cost: float,
        cost_thresh: float,
    ) -> None:
        msg = (
            f"Next expected cost {next_cost:.2f} exceeds cost threshold {cost_thresh:.2f}! "
            f"Stopping. Saved training results: time={time_consumed:.2f}, "
            f"energy={energy_consumed:.2f}, cost={cost:.2f}, reached=false"
        )
        super().__init__(msg)
        self.time_consumed = time_consumed
        self.energy_consumed = energy_consumed
        self.cost = cost
        self.next_cost = next_cost
        self.cost_thresh = cost_thresh
