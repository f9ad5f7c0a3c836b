"""`ZeusMaster`: run a recurring job many times, choosing batch sizes with a policy."""

from __future__ import annotations

import copy
import json
import math
import os
import pprint
import subprocess
import sys
import time
from typing import IO

from zeus.optimizer.recurring.job import HistoryEntry, Job
from zeus.optimizer.recurring.policy.interface import BatchSizeOptimizer
from zeus.util.metric import zeus_cost

__all__ = ["ZeusMaster", "MAX_TRIES"]

#: Tries per recurrence before the target metric is declared unreachable.
MAX_TRIES = 20


class ZeusMaster:
    """Drive the recurrences of a job: pick a batch size, launch the training script, learn.

    Each run is a child process started from `job.command` with the `ZEUS_*` environment of
    the protocol (see `zeus.run.session`); it reports back through
    `{logdir}/rec{NN}+try{NN}+bs{B}.train.json`.

    Args:
        batch_size_optimizer: The batch-size policy (deep-copied per `run`).
        log_base: Absolute directory under which each `run` makes its log directory.
        monitor_path: Absolute path of the legacy power monitor binary; passed on to the
            training script as `ZEUS_MONITOR_PATH` (ZeusMonitor does not need it).
        seed: Seed of the first run; each run gets the next one.
        observer_mode: Profile power limits but train at the maximum limit.
        profile_warmup_iters: Warm-up iterations per profiled power limit.
        profile_measure_iters: Measured iterations per profiled power limit.

    Raises:
        ValueError: a path is not absolute, or the profile parameters are not positive.

    """

    def __init__(
        self,
        batch_size_optimizer: BatchSizeOptimizer,
        log_base: str,
        monitor_path: str,
        seed: int = 123456,
        observer_mode: bool = False,
        profile_warmup_iters: int = 10,
        profile_measure_iters: int = 40,
    ) -> None:
        if not os.path.isabs(monitor_path):
            raise ValueError(f"monitor_path must be absolute, got '{monitor_path}'")
        if not os.path.isabs(log_base):
            raise ValueError(f"log_base must be absolute, got '{log_base}'")
        if profile_warmup_iters < 0 or profile_measure_iters <= 0:
            raise ValueError(
                "profile_warmup_iters must be >= 0 and profile_measure_iters > 0, got "
                f"{profile_warmup_iters} and {profile_measure_iters}"
            )
        self.bso = batch_size_optimizer
        self.log_base = log_base
        self.monitor_path = monitor_path
        self.seed = seed
        self.observer_mode = observer_mode
        self.profile_warmup_iters = profile_warmup_iters
        self.profile_measure_iters = profile_measure_iters
        os.makedirs(log_base, exist_ok=True)

        from zeus.device import get_gpus

        gpus = get_gpus(ensure_homogeneous=True)
        self.num_gpus = len(gpus)
        # Watts, as in the cost metric.
        self.max_pl = gpus.get_power_management_limit_constraints(0)[1] // 1000

    def build_logdir(
        self,
        job: Job,
        num_recurrence: int,
        eta_knob: float,
        beta_knob: float,
        exist_ok: bool = True,
    ) -> str:
        """Create and return the log directory of one `run`.

        The name ends with a `%Y%m%d%H%M%S` timestamp (the reference used `%s`, epoch seconds,
        by mistake; `docs/reference-differences.md`, bug 7).
        """
        stamp = time.strftime("%Y%m%d%H%M%S")
        logdir = os.path.join(
            self.log_base,
            f"{job.to_logdir()}+x{num_recurrence}+eta{eta_knob}+beta{beta_knob}+{stamp}",
        )
        os.makedirs(logdir, exist_ok=exist_ok)
        return logdir

    def run_job(
        self,
        job: Job,
        batch_size: int,
        learning_rate: float,
        seed: int,
        logdir: str,
        rec_i: int,
        tries: int,
        eta_knob: float,
        cost_ub: float,
    ) -> tuple[float, float, bool]:
        """Run one training process and return its (energy J, time s, reached).

        Raises:
            RuntimeError: the process wrote no train.json.

        """
        job_id = f"rec{rec_i:02d}+try{tries:02d}"
        env = dict(os.environ)
        env.update(
            ZEUS_LOG_DIR=logdir,
            ZEUS_JOB_ID=job_id,
            ZEUS_COST_THRESH="inf" if cost_ub == math.inf else str(cost_ub),
            ZEUS_ETA_KNOB=str(eta_knob),
            ZEUS_TARGET_METRIC=str(job.target_metric),
            ZEUS_MONITOR_PATH=self.monitor_path,
            ZEUS_PROFILE_PARAMS=f"{self.profile_warmup_iters},{self.profile_measure_iters}",
            ZEUS_USE_OPTIMAL_PL=str(not self.observer_mode),
        )
        command = job.gen_command(batch_size, learning_rate, seed, rec_i)
        log_path = os.path.join(logdir, f"{job_id}.train.log")
        print(f"[ZeusMaster] {job_id}: bs={batch_size} lr={learning_rate:g} seed={seed}")
        with open(log_path, "w") as log, open(log_path) as tail:
            proc = subprocess.Popen(
                command, cwd=job.workdir, env=env, stdout=log, stderr=subprocess.STDOUT
            )
            while proc.poll() is None:
                _copy(tail, sys.stdout)
                time.sleep(0.2)
            _copy(tail, sys.stdout)
        train_json = os.path.join(logdir, f"{job_id}+bs{batch_size}.train.json")
        if not os.path.exists(train_json):
            raise RuntimeError(
                f"{train_json} was not written (exit code {proc.returncode}); see {log_path}"
            )
        with open(train_json) as f:
            result = json.load(f)
        reached = result["reached"]
        if isinstance(reached, str):
            reached = reached.strip().lower() == "true"
        return float(result["energy"]), float(result["time"]), bool(reached)

    def run(
        self,
        job: Job,
        num_recurrence: int,
        batch_sizes: list[int],
        beta_knob: float,
        eta_knob: float,
    ) -> list[HistoryEntry]:
        """Run `num_recurrence` recurrences of `job`.

        A recurrence retries (up to 20 times) until a run reaches the target. Each run is
        capped at `beta_knob × min_cost`, where `min_cost` is the lowest accumulated cost
        (failed tries included) of a successful recurrence so far; recurrence 1 has no cap.

        Raises:
            ValueError: the job lacks `default_bs` or `command`, or η is outside [0, 1].
            RuntimeError: the default batch size does not reach the target in recurrence 1, or
                a recurrence needs more than 20 tries.

        """
        if job.default_bs is None:
            raise ValueError(f"{job} needs a default batch size")
        if not job.command:
            raise ValueError(f"{job} needs a command")
        if not 0.0 <= eta_knob <= 1.0:
            raise ValueError(f"eta_knob must be in [0, 1], got {eta_knob}")
        if num_recurrence < 1:
            raise ValueError(f"num_recurrence must be at least 1, got {num_recurrence}")
        bso = copy.deepcopy(self.bso)
        logdir = self.build_logdir(job, num_recurrence, eta_knob, beta_knob)
        bso.register_job(job, batch_sizes)
        seed = self.seed
        min_cost = math.inf
        history: list[HistoryEntry] = []
        for rec_i in range(1, num_recurrence + 1):
            cost_acc = 0.0
            for tries in range(1, MAX_TRIES + 1):
                bs = bso.predict(job)
                lr = job.scale_lr(bs)
                energy, tta, reached = self.run_job(
                    job, bs, lr, seed, logdir, rec_i, tries, eta_knob, beta_knob * min_cost
                )
                seed += 1
                cost = zeus_cost(energy, tta, eta_knob, self.max_pl * self.num_gpus)
                cost_acc += cost
                bso.observe(job, bs, cost, reached)
                history.append(HistoryEntry(bs, None, energy, reached, tta))
                with open(os.path.join(logdir, "history.py"), "w") as f:
                    f.write(pprint.pformat(history) + "\n")
                if reached:
                    min_cost = min(min_cost, cost_acc)
                    break
                if rec_i == 1:
                    raise RuntimeError(f"The default batch size {job.default_bs} did not converge.")
            else:
                raise RuntimeError(f"Unreachable target metric: {MAX_TRIES} tries in rec {rec_i}.")
        return history


def _copy(src: IO[str], dst: IO[str]) -> None:
    data = src.read()
    if data:
        dst.write(data)
        dst.flush()
