"""One rank of a two-process data-parallel job (gloo on CPU) using ZeusDataLoader.

The simulated GPUs stand in for the GPUs: rank 0 measures both. Prints `stopped` when the
cost threshold ends the job, `finished` otherwise.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
import zeus.device.sim
from torch.utils.data import DistributedSampler, TensorDataset
from zeus.run import ZeusDataLoader
from zeus.util.metric import ZeusCostThresholdExceededError


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=2
    )
    data = TensorDataset(torch.randn(512, 4), torch.zeros(512, dtype=torch.long))
    train = ZeusDataLoader(
        data,
        batch_size=8,
        max_epochs=20,
        distributed="dp",
        sampler=DistributedSampler(data, num_replicas=2, rank=a.rank),
    )
    epochs = 0
    try:
        for _ in train.epochs():
            epochs += 1
            for _batch in train:
                if a.rank == 0:
                    zeus.device.sim.run(0.04, [0, 1])
            train.report_metric(0.0, higher_is_better=True)  # never reaches the target
    except ZeusCostThresholdExceededError as e:
        print(f"stopped after {epochs} epochs: {e}", flush=True)
        dist.destroy_process_group()
        return 0
    print(f"finished after {epochs} epochs", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
