"""Batch-size and power-limit policies of recurring jobs (Zeus, NSDI'23).

Implement `BatchSizeOptimizer` / `PowerLimitOptimizer` to plug your own policy into
`zeus.run.ZeusMaster` or `zeus.simulate.Simulator`.
"""

from zeus.optimizer.recurring.policy.interface import BatchSizeOptimizer, PowerLimitOptimizer
from zeus.optimizer.recurring.policy.mab import GaussianTS
from zeus.optimizer.recurring.policy.optimizer import (
    GTSBatchSizeOptimizer,
    JITPowerLimitOptimizer,
    PruningExploreManager,
    PruningGTSBatchSizeOptimizer,
)

__all__ = [
    "BatchSizeOptimizer",
    "PowerLimitOptimizer",
    "GaussianTS",
    "GTSBatchSizeOptimizer",
    "JITPowerLimitOptimizer",
    "PruningExploreManager",
    "PruningGTSBatchSizeOptimizer",
]
