"""`EarlyStopController`: stop training on a cost budget, an epoch budget or a target metric."""

from __future__ import annotations

from typing import Any

from zeus.callback import Callback
from zeus.device import get_gpus
from zeus.util.logging import get_logger
from zeus.util.metric import zeus_cost

__all__ = ["EarlyStopController"]

logger = get_logger(__name__)

_WINDOW = "__EarlyStopController_epoch"


class EarlyStopController(Callback):
    """Decides when training should stop; read `should_training_stop` after each hook.

    Three independent criteria, any of which stops training for good:

    - `max_epochs`: that many epochs have ended.
    - `cost_threshold`: the Zeus cost spent so far plus the average cost of an epoch reaches the
      threshold, i.e. one more epoch would likely exceed it. Each epoch's cost is the sum over
      the monitor's GPUs of `zeus_cost(energy, time, eta_knob, max power limit of the GPU)`.
    - `target_metric`: `on_evaluate(metric)` reaches it (`>=` if `higher_is_better`, else `<=`).
    """

    def __init__(
        self,
        monitor: Any = None,
        eta_knob: float = 0.5,
        cost_threshold: float | None = None,
        max_epochs: int | None = None,
        target_metric: float | None = None,
        higher_is_better: bool | None = None,
    ) -> None:
        """Check the criteria and cache each GPU's maximum power limit.

        Args:
            monitor: A `ZeusMonitor` for the GPUs whose cost counts; required with
                `cost_threshold`.
            eta_knob: Weight of energy against time in the cost, in [0, 1].
            cost_threshold: Cost budget (positive); requires `monitor`.
            max_epochs: Epoch budget (positive).
            target_metric: Validation metric that ends training; requires `higher_is_better`.
            higher_is_better: Whether larger metrics are better.

        Raises:
            ValueError: a bad value (named in the message), or an argument given without its
                partner (`monitor`/`cost_threshold`, `target_metric`/`higher_is_better`).

        """
        if max_epochs is not None and (isinstance(max_epochs, bool) or max_epochs <= 0):
            raise ValueError(f"max_epochs must be positive, got {max_epochs!r}")
        if cost_threshold is not None and not cost_threshold > 0:
            raise ValueError(f"cost_threshold must be positive, got {cost_threshold!r}")
        if (cost_threshold is None) != (monitor is None):
            raise ValueError(
                "cost_threshold and monitor must be given together "
                f"(cost_threshold={cost_threshold!r}, monitor={monitor!r})"
            )
        if (target_metric is None) != (higher_is_better is None):
            raise ValueError(
                "target_metric and higher_is_better must be given together "
                f"(target_metric={target_metric!r}, higher_is_better={higher_is_better!r})"
            )
        if not 0.0 <= eta_knob <= 1.0:
            raise ValueError(f"eta_knob must be between 0 and 1, got {eta_knob!r}")

        self.monitor = monitor
        self.eta_knob = eta_knob
        self.cost_threshold = cost_threshold
        self.max_epochs = max_epochs
        self.target_metric = target_metric
        self.higher_is_better = higher_is_better

        self.epochs_trained = 0
        self.epoch_costs: list[float] = []
        self._should_stop = False
        self.max_power: dict[int, int] = {}
        if monitor is not None:
            gpus = get_gpus()
            for i in monitor.gpu_indices:
                self.max_power[i] = gpus.get_power_management_limit_constraints(i)[1] // 1000

    @property
    def should_training_stop(self) -> bool:
        """Whether training should stop (sticky once true)."""
        return self._should_stop

    def _stop(self, why: str) -> None:
        if not self._should_stop:
            logger.info("[EarlyStopController] Stopping training: %s", why)
        self._should_stop = True

    def on_epoch_begin(self) -> None:
        """Start measuring the epoch's cost."""
        if self.cost_threshold is not None:
            self.monitor.begin_window(_WINDOW)

    def on_epoch_end(self) -> None:
        """Count the epoch and check the epoch and cost budgets."""
        self.epochs_trained += 1
        if self.max_epochs is not None and self.epochs_trained >= self.max_epochs:
            self._stop(f"reached max_epochs={self.max_epochs}")
            if self.cost_threshold is not None:
                # Close the window so a stopped run leaves nothing open in the monitor.
                self.monitor.end_window(_WINDOW, cancel=True)
            return
        if self.cost_threshold is None:
            return
        m = self.monitor.end_window(_WINDOW)
        cost = sum(
            zeus_cost(m.energy[i], m.time, self.eta_knob, self.max_power[i]) for i in self.max_power
        )
        self.epoch_costs.append(cost)
        spent = sum(self.epoch_costs)
        expected_next = spent + spent / len(self.epoch_costs)
        if expected_next >= self.cost_threshold:
            self._stop(
                f"next expected cost {expected_next:.2f} reaches the threshold "
                f"{self.cost_threshold:.2f}"
            )

    def on_evaluate(self, metric: float) -> None:
        """Stop when the validation metric reaches the target."""
        if self.target_metric is None:
            return
        reached = (
            metric >= self.target_metric if self.higher_is_better else metric <= self.target_metric
        )
        if reached:
            self._stop(f"metric {metric} reached the target {self.target_metric}")
