"""Optimizers: power limit, batch size (`batch_size`), pipeline frequency (`perseus`).

`GlobalPowerLimitOptimizer` and `HFGlobalPowerLimitOptimizer` are importable from here; they
are loaded on first access, so importing this package never imports torch or transformers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GlobalPowerLimitOptimizer", "HFGlobalPowerLimitOptimizer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from zeus.optimizer import power_limit

        return getattr(power_limit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
