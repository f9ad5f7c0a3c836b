"""A training script for ZeusMaster tests: no framework, the simulated GPU does the "work".

It speaks the ZEUS_* protocol through `zeus.run.JobSession`: each iteration runs one unit of
work scaled by the batch size on the simulated GPU (virtual clock), and the validation metric
reaches the target after a number of epochs that depends on the batch size (`--converge`,
e.g. `32:3,64:2`; batch sizes not listed never converge).
"""

from __future__ import annotations

import argparse
import sys

import zeus.device.sim
from zeus.run import JobSession
from zeus.util.metric import ZeusCostThresholdExceededError

DATASET = 4096


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bs", type=int, required=True)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--converge", required=True)
    p.add_argument("--eval-iters", type=int, default=4)
    a = p.parse_args()
    converge = {int(k): int(v) for k, v in (kv.split(":") for kv in a.converge.split(","))}
    iters = DATASET // a.bs
    s = JobSession(a.bs, a.epochs, train_iters=iters, eval_iters=a.eval_iters)
    try:
        for epoch in s.epochs():
            s.begin_epoch("train")
            for _ in range(iters):
                s.before_train_iteration()
                zeus.device.sim.run(a.bs / 1024, [0])
            s.end_epoch("train")
            s.begin_epoch("eval")
            for _ in range(a.eval_iters):
                zeus.device.sim.run(0.05, [0])
            s.end_epoch("eval")
            target = converge.get(a.bs)
            metric = 1.0 if target is not None and epoch + 1 >= target else 0.0
            print(f"epoch {epoch + 1}: metric {metric}")
            s.report_metric(metric, higher_is_better=True)
    except ZeusCostThresholdExceededError as e:
        print(f"stopped: {e}")
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
