"""Recurring jobs: `ZeusMaster` runs them; `ZeusDataLoader` / `JobSession` run inside them.

PyTorch is optional: importing `zeus.run` never imports torch; `ZeusDataLoader` is imported
on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zeus.job import HistoryEntry
from zeus.run.master import ZeusMaster
from zeus.run.session import JobSession

if TYPE_CHECKING:
    from zeus.run.dataloader import ZeusDataLoader

__all__ = ["ZeusMaster", "ZeusDataLoader", "JobSession", "HistoryEntry"]


def __getattr__(name: str) -> Any:
    if name == "ZeusDataLoader":
        from zeus.run.dataloader import ZeusDataLoader

        return ZeusDataLoader
    raise AttributeError(f"module 'zeus.run' has no attribute '{name}'")
