"""`HFGlobalPowerLimitOptimizer`: `GlobalPowerLimitOptimizer` as a Hugging Face callback."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from zeus.optimizer.power_limit.optimizer import GlobalPowerLimitOptimizer
from zeus.optimizer.power_limit.profiler import DEFAULT_PL_STEP_W
from zeus.optimizer.power_limit.selectors import OptimumSelector

try:
    from transformers import TrainerCallback

    _TRANSFORMERS_ERROR: ImportError | None = None
except ImportError as _e:  # transformers is optional: the class exists, construction explains.
    TrainerCallback = object  # type: ignore[assignment,misc]
    _TRANSFORMERS_ERROR = _e

__all__ = ["HFGlobalPowerLimitOptimizer"]


class HFGlobalPowerLimitOptimizer(TrainerCallback):  # type: ignore[misc,valid-type]
    """`GlobalPowerLimitOptimizer` for `transformers.Trainer(callbacks=[...])`.

    The trainer's `on_epoch_begin`, `on_epoch_end`, `on_step_begin` and `on_step_end` events are
    forwarded to the wrapped optimizer (`self.optimizer`). Arguments are those of
    `GlobalPowerLimitOptimizer`.
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
        """Build the wrapped `GlobalPowerLimitOptimizer`.

        Raises:
            ImportError: `transformers` is not installed.

        """
        if _TRANSFORMERS_ERROR is not None:
            raise ImportError(
                "HFGlobalPowerLimitOptimizer needs transformers: pip install transformers"
            ) from _TRANSFORMERS_ERROR
        self.optimizer = GlobalPowerLimitOptimizer(
            monitor=monitor,
            optimum_selector=optimum_selector,
            wait_steps=wait_steps,
            warmup_steps=warmup_steps,
            profile_steps=profile_steps,
            pl_step=pl_step,
            profile_path=profile_path,
        )

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Forward to `GlobalPowerLimitOptimizer.on_epoch_begin`."""
        self.optimizer.on_epoch_begin()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Forward to `GlobalPowerLimitOptimizer.on_epoch_end`."""
        self.optimizer.on_epoch_end()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Forward to `GlobalPowerLimitOptimizer.on_step_begin`."""
        self.optimizer.on_step_begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Forward to `GlobalPowerLimitOptimizer.on_step_end`."""
        self.optimizer.on_step_end()
