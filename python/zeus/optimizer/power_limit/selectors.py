"""Optimum selectors: pick the power limit to train with from the profiled measurements.

The built-in selectors compute in Rust (`zeus._core.power_limit.PowerLimitSelector`). A user
may subclass `OptimumSelector` in Python and implement `select`.

Every selector receives the measurements in profiling order (highest power limit first) and
breaks ties in favour of the earliest, that is, the highest power limit among equals.
"""

from __future__ import annotations

import abc
from typing import Sequence

from zeus import _core
from zeus.optimizer.power_limit.models import PowerLimitMeasurement

__all__ = ["OptimumSelector", "Energy", "Time", "ZeusCost", "MaxSlowdownConstraint"]


class OptimumSelector(abc.ABC):
    """Base class of optimum selectors."""

    @abc.abstractmethod
    def select(self, measurements: list[PowerLimitMeasurement]) -> int:
        """Return the optimal power limit in watts.

        Args:
            measurements: One measurement per profiled power limit, in profiling order.

        """


class _CoreSelector(OptimumSelector):
    """A selector whose arithmetic lives in `zeus._core`."""

    _core_selector: _core.power_limit.PowerLimitSelector

    def select(self, measurements: Sequence[PowerLimitMeasurement]) -> int:
        """Return the optimal power limit in watts.

        Raises:
            ValueError: `measurements` is empty or holds a non-positive value.

        """
        return self._core_selector.select([(m.power_limit, m.energy, m.time) for m in measurements])

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"


class Energy(_CoreSelector):
    """The power limit that used the least energy."""

    def __init__(self) -> None:
        """Build the selector."""
        self._core_selector = _core.power_limit.PowerLimitSelector.energy()


class Time(_CoreSelector):
    """The power limit that took the least time."""

    def __init__(self) -> None:
        """Build the selector."""
        self._core_selector = _core.power_limit.PowerLimitSelector.time()


class ZeusCost(_CoreSelector):
    """The power limit with the least Zeus cost `eta * energy + (1 - eta) * max_power * time`.

    `max_power` is the highest profiled power limit (W) times `world_size`, so that time is
    converted to joules at the power all GPUs could draw together.
    """

    def __init__(self, eta_knob: float, world_size: int = 1) -> None:
        """Build the selector.

        Args:
            eta_knob: Weight of energy against time, in [0, 1]. 1 minimises energy, 0 time.
            world_size: Number of GPUs whose energy each measurement sums.

        Raises:
            ValueError: `eta_knob` is outside [0, 1] or `world_size` is below 1.

        """
        if isinstance(world_size, bool) or not isinstance(world_size, int):
            raise ValueError(f"world_size must be an integer, got {world_size!r}")
        self._core_selector = _core.power_limit.PowerLimitSelector.zeus_cost(
            float(eta_knob), world_size
        )
        self.eta_knob = eta_knob
        self.world_size = world_size


class MaxSlowdownConstraint(_CoreSelector):
    """The lowest power limit whose time is within `factor` of the time at the highest limit."""

    def __init__(self, factor: float) -> None:
        """Build the selector.

        Args:
            factor: Allowed slowdown, at least 1 (1.1 allows 10% longer steps).

        Raises:
            ValueError: `factor` is below 1.

        """
        self._core_selector = _core.power_limit.PowerLimitSelector.max_slowdown(float(factor))
        self.factor = factor
