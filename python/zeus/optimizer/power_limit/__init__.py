"""Power-limit optimization: profile GPU power limits during training and keep the best one.

`GlobalPowerLimitOptimizer` is a training-loop callback; `HFGlobalPowerLimitOptimizer` is the
same as a Hugging Face `transformers.TrainerCallback` (imported lazily: `transformers` is needed
only when that name is used). The optimum selectors decide which profiled limit wins.
"""

from __future__ import annotations

# zeus 0.8 tests patch `zeus.optimizer.power_limit.atexit`; keep the name importable here
# (restores are registered by `zeus.device.settings`).
import atexit  # noqa: F401
from typing import Any

from zeus.optimizer.power_limit.models import (
    Done,
    PowerLimitMeasurement,
    Profiling,
    Ready,
    Warmup,
)
from zeus.optimizer.power_limit.optimizer import GlobalPowerLimitOptimizer
from zeus.optimizer.power_limit.selectors import (
    Energy,
    MaxSlowdownConstraint,
    OptimumSelector,
    Time,
    ZeusCost,
)

__all__ = [
    "Done",
    "Energy",
    "GlobalPowerLimitOptimizer",
    "HFGlobalPowerLimitOptimizer",
    "MaxSlowdownConstraint",
    "OptimumSelector",
    "PowerLimitMeasurement",
    "Profiling",
    "Ready",
    "Time",
    "Warmup",
    "ZeusCost",
]


def __getattr__(name: str) -> Any:
    if name == "HFGlobalPowerLimitOptimizer":
        from zeus.optimizer.power_limit.hf import HFGlobalPowerLimitOptimizer

        return HFGlobalPowerLimitOptimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
