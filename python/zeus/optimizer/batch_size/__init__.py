"""Batch size optimizer: learns the cheapest batch size of a recurring training job.

A client callback and a REST server (pruning exploration, then Gaussian Thompson sampling).

The client (`BatchSizeOptimizer`) needs the `bso` extra (httpx); the server
(`zeus.optimizer.batch_size.server`) needs `bso-server`.
"""

from __future__ import annotations

from typing import Any

from zeus.optimizer.batch_size.common import JobSpec

__all__ = ["BatchSizeOptimizer", "JobSpec"]


def __getattr__(name: str) -> Any:
    # The client imports httpx and the GPU layer; the server should not need either.
    if name == "BatchSizeOptimizer":
        from zeus.optimizer.batch_size.client import BatchSizeOptimizer

        return BatchSizeOptimizer
    raise AttributeError(name)
