"""Run the reference simulator (zeus-ml 0.8.2) the way `python -m zeus.simulate` runs ours.

This script runs under a throwaway venv that has `zeus-ml==0.8.2` installed (never a project
dependency), e.g. `/tmp/refvenv/bin/python benchmarks/simulate_reference.py TRACE_DIR ...`.
It prints one JSON object per (gpu, workload, seed) with the totals and the wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time

import pandas as pd
from zeus.job import Job
from zeus.policy.optimizer import JITPowerLimitOptimizer, PruningGTSBatchSizeOptimizer
from zeus.simulate import Simulator

# dataset -> (network, optimizer, target metric, max epochs, b0), as run_alibaba.py.
WORKLOADS = {
    "cifar100": ("shufflenetv2", "adadelta", 0.6, 100, 1024),
    "imagenet": ("resnet50", "adadelta", 0.65, 100, 256),
    "librispeech": ("deepspeech2", "adamw", 40.0, 16, 256),
    "movielens-1m": ("ncf", "adam", 0.41, 100, 1024),
    "sentiment140": ("bert_base_uncased", "adamw", 0.84, 10, 128),
    "squad": ("bert_base_uncased", "adamw", 84.0, 6, 32),
}


def run(trace_dir: str, gpu: str, workload: str, seed: int, eta: float, beta: float) -> dict:
    """Simulate one workload with the reference; totals and wall time."""
    train = pd.read_csv(f"{trace_dir}/summary_train.csv")
    power = pd.read_csv(f"{trace_dir}/summary_power_{gpu}.csv")
    net, opt, tm, me, b0 = WORKLOADS[workload]
    merged = train.merge(power, how="inner")
    sub = merged[(merged.dataset == workload) & (merged.network == net) & (merged.optimizer == opt)]
    bss = sorted(sub.batch_size.unique())
    pls = sorted(sub.power_limit.unique())
    job = Job(workload, net, opt, tm, me, min(b0, max(bss)))
    n = 2 * len(bss) * len(pls)
    start = time.perf_counter()
    sim = Simulator(
        train,
        power,
        PruningGTSBatchSizeOptimizer(seed=seed, verbose=False),
        JITPowerLimitOptimizer(verbose=False),
        seed=seed,
        verbose=False,
    )
    # The reference prints even with verbose=False in places; keep stdout clean.
    with contextlib.redirect_stdout(io.StringIO()):
        hist = sim.simulate_one_job(job, n, beta, eta)
    wall = time.perf_counter() - start
    maxp = merged.power_limit.max().item()
    return {
        "gpu": gpu,
        "workload": workload,
        "seed": seed,
        "recurrences": n,
        "energy": sum(h.energy for h in hist),
        "time": sum(h.time for h in hist),
        "cost": sum(eta * h.energy + (1 - eta) * maxp * h.time for h in hist),
        "final_batch_size": int(hist[-1].bs),
        "final_power_limit": int(hist[-1].pl),
        "wall_s": wall,
    }


def main() -> None:
    """Parse arguments and print one JSON line per simulation."""
    p = argparse.ArgumentParser()
    p.add_argument("trace_dir")
    p.add_argument("--gpus", default="v100,a40")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--eta", type=float, default=0.5)
    p.add_argument("--beta", type=float, default=2.0)
    a = p.parse_args()
    for gpu in a.gpus.split(","):
        for w in a.workloads.split(","):
            for s in a.seeds.split(","):
                print(json.dumps(run(a.trace_dir, gpu, w, int(s), a.eta, a.beta)), flush=True)


if __name__ == "__main__":
    main()
