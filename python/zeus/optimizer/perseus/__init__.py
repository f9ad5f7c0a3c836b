"""Perseus: energy-optimal GPU frequency plans for pipeline-parallel training.

The client (`PerseusOptimizer`, a training callback) runs the plan the Perseus server
(`zeus.optimizer.perseus.server`, console script `zeus-perseus-server`) computes. Needs the
`perseus` extra.
"""

from zeus.optimizer.perseus.frequency_controller import FrequencyController
from zeus.optimizer.perseus.optimizer import PerseusOptimizer, ZeusPerseusServerError

# Zeus 0.16 calls the client `PipelineFrequencyOptimizer` (in `zeus.optimizer.pipeline_frequency`).
PipelineFrequencyOptimizer = PerseusOptimizer

__all__ = [
    "FrequencyController",
    "PerseusOptimizer",
    "PipelineFrequencyOptimizer",
    "ZeusPerseusServerError",
]
