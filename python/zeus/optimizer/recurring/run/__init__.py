"""Recurring jobs: `ZeusMaster` runs them; `ZeusDataLoader` / `JobSession` run inside them.

PyTorch is optional: importing `zeus.run` never imports torch; `ZeusDataLoader` is imported
on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zeus.optimizer.recurring.job import HistoryEntry
from zeus.optimizer.recurring.run.master import ZeusMaster
from zeus.optimizer.recurring.run.session import JobSession

if TYPE_CHECKING:
    from zeus.optimizer.recurring.run.dataloader import ZeusDataLoader

__all__ = ["ZeusMaster", "ZeusDataLoader", "JobSession", "HistoryEntry"]


def __getattr__(name: str) -> Any:
    if name == "ZeusDataLoader":
        from zeus.optimizer.recurring.run.dataloader import ZeusDataLoader

        return ZeusDataLoader
    raise AttributeError(f"module 'zeus.run' has no attribute '{name}'")
