"""Trace-driven recurring jobs through the real client and server (shared by several tests).

Each recurrence is one training run of the job: the client asks the server for a batch size,
the test samples a training path for it from the measured trace (the epoch where the target is
reached), and every epoch the fake monitor reports the traced time and energy of that batch
size at its cheapest power limit (what a power limit optimizer would settle on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd
from zeus.optimizer.batch_size import BatchSizeOptimizer, JobSpec
from zeus.optimizer.batch_size.exceptions import ZeusBSOTrainFailError

ETA = 0.5
BETA = 2.0
TARGET = 40.0  # Word error rate: lower is better.
MAX_EPOCHS = 16
DEFAULT_BS = 192
GPU_MAX_POWER = 250  # Simulated V100, and the trace's largest power limit.


@dataclass
class Trace:
    batch_sizes: list[int]
    epoch: dict[int, tuple[float, float]]  # bs -> (seconds, joules) per epoch
    target_epochs: dict[int, list[float]]  # bs -> epoch reaching the target per run (nan: never)
    num_power_limits: int


def load_trace(data_dir: Path) -> Trace:
    train = pd.read_csv(data_dir / "zeus-traces" / "summary_train.csv")
    power = pd.read_csv(data_dir / "zeus-traces" / "summary_power_v100.csv")
    sel = {"dataset": "librispeech", "network": "deepspeech2", "optimizer": "adamw"}
    for k, v in sel.items():
        train, power = train[train[k] == v], power[power[k] == v]
    bss = sorted(int(b) for b in set(train.batch_size) & set(power.batch_size))
    power = power.assign(
        epoch_cost=ETA * power.average_power * power.time_per_epoch
        + (1 - ETA) * GPU_MAX_POWER * power.time_per_epoch
    )
    epoch = {}
    for bs in bss:
        row = power[power.batch_size == bs].sort_values("epoch_cost").iloc[0]
        epoch[bs] = (float(row.time_per_epoch), float(row.time_per_epoch * row.average_power))
    runs = train[train.target_metric == TARGET]
    target_epochs = {bs: [float(x) for x in runs[runs.batch_size == bs].target_epoch] for bs in bss}
    return Trace(bss, epoch, target_epochs, int(power.power_limit.nunique()))


class TraceMonitor:
    """The monitor contract (`gpu_indices`, `begin_window`, `end_window`), fed by the trace."""

    def __init__(self, epoch: tuple[float, float] = (0.0, 0.0)) -> None:
        self.gpu_indices = [0]
        self.epoch = epoch
        self.windows = 0

    def begin_window(self, key: str, sync_cuda: bool = True) -> None:
        pass

    def end_window(self, key: str, sync_cuda: bool = True) -> _M:
        self.windows += 1
        return _M(*self.epoch)


@dataclass
class _M:
    time: float
    total_energy: float


def job_spec(job_id: str, trace: Trace, seed: int = 1) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        job_id_prefix="librispeech",
        batch_sizes=trace.batch_sizes,
        default_batch_size=DEFAULT_BS,
        eta_knob=ETA,
        beta_knob=BETA,
        target_metric=TARGET,
        higher_is_better_metric=False,
        max_epochs=MAX_EPOCHS,
        num_pruning_rounds=2,
        window_size=0,
        mab_num_explorations=2,
        mab_seed=seed,
    )


@dataclass
class SimResult:
    batch_sizes: list[int] = field(default_factory=list)
    converged: list[bool] = field(default_factory=list)
    reports: int = 0


def simulate(
    url: str,
    job: JobSpec,
    trace: Trace,
    recurrences: int,
    seed: int = 1,
    after_report: Optional[Callable[[int, int], None]] = None,
) -> SimResult:
    """Run `recurrences` trainings of `job`; `after_report(recurrence, epoch)` is a hook."""
    rng = np.random.default_rng(seed)
    out = SimResult()
    for i in range(recurrences):
        monitor = TraceMonitor()
        bso = BatchSizeOptimizer(monitor, url, job, max_retries=8)
        try:
            bs = bso.get_batch_size()
            runs = trace.target_epochs[bs]
            target_epoch = runs[int(rng.integers(len(runs)))]
            monitor.epoch = trace.epoch[bs]
            bso.on_train_begin()
            converged = False
            for epoch in range(1, MAX_EPOCHS + 1):
                reached = not math.isnan(target_epoch) and epoch >= target_epoch
                try:
                    bso.on_evaluate(TARGET - 1 if reached else TARGET + 1)
                except ZeusBSOTrainFailError:
                    break
                finally:
                    out.reports += 1
                    if after_report is not None:
                        after_report(i, epoch)
                if bso.training_finished:
                    converged = True
                    break
            out.batch_sizes.append(bs)
            out.converged.append(converged)
        finally:
            bso._unregister_atexit()
            bso.close()
    return out
