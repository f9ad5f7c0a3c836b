"""The training side of `ZeusMaster`'s protocol, without any deep-learning framework.

`JobSession` is what `ZeusDataLoader` does under the hood, usable from any training loop (JAX,
plain NumPy, a simulated workload): it reads the `ZEUS_*` environment that `ZeusMaster` sets,
profiles GPU power limits just in time inside the first epochs, measures every epoch with
`ZeusMonitor`, stops predictively before the cost threshold is crossed, and writes the
`train.json` / `power.json` files the master reads back.

Protocol (environment, all optional except `ZEUS_TARGET_METRIC`):

| Variable | Meaning | Default |
|---|---|---|
| `ZEUS_TARGET_METRIC` | validation metric that counts as reached | required |
| `ZEUS_LOG_DIR` | directory of this run's files | `zeus_log` |
| `ZEUS_JOB_ID` | name of this run, e.g. `rec01+try01` | `zeus` |
| `ZEUS_COST_THRESH` | stop before the cost would reach this | `inf` |
| `ZEUS_ETA_KNOB` | energy/time weight η | 0.5 |
| `ZEUS_MONITOR_PATH` | legacy monitor binary (unused, accepted) | `zeus_monitor` |
| `ZEUS_PROFILE_PARAMS` | `warmup,measure` iterations per power limit | `10,40` |
| `ZEUS_USE_OPTIMAL_PL` | use the optimal power limit (false = observer mode) | true |

Power limits are profiled by the power-limit optimizer's state machine, `PowerLimitProfiler`
(`optimizer/power_limit/profiler.py`), with the window names of zeus 0.8's ZeusDataLoader: each
limit is warmed up and measured within one training epoch (a limit that would not finish in
what is left of the epoch waits for the next one), a window too short to be measured is
repeated over more iterations, and the measured iterations give the limit's average power and
throughput.

Files: `{log_dir}/{job_id}+bs{B}.train.json` = `{"energy", "time", "cost", "num_epochs",
"reached"}`, and `{log_dir}/bs{B}.power.json` = `{"job_id", "train_power", "train_throughput",
"eval_power", "eval_throughput", "optimal_pl"}` (power limits in mW as string keys, power in W,
throughput in iterations/s). A batch size is profiled only while its power.json is missing.

Fixed reference bugs (`docs/reference-differences.md`, bug 4): the optimal power limit uses
the maximum power in watts (the reference mixed mW and W, which made it pick the fastest
limit), and the monitor path is not passed as `approx_instant_energy`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

from zeus.optimizer.power_limit.models import PowerLimitMeasurement
from zeus.optimizer.power_limit.profiler import (
    PowerLimitProfiler,
    SettingNames,
    power_limit_steps,
)
from zeus.optimizer.power_limit.selectors import ZeusCost
from zeus.util.env import get_env
from zeus.util.metric import ZeusCostThresholdExceededError, zeus_cost

__all__ = ["JobSession", "ProtocolEnv", "compute_optimal_pl", "power_limit_steps"]

EPOCH_WINDOW = "__ZeusDataLoader_epoch"
# zeus 0.8's ZeusDataLoader named its profiling windows so; logs of it read the same.
PROFILE_WINDOW_PREFIX = "__ZeusDataLoader_power_limit_"
_SETTING_NAMES = SettingNames(
    warmup="the warm-up count of ZEUS_PROFILE_PARAMS",
    profile="the measure count of ZEUS_PROFILE_PARAMS",
    example="ZEUS_PROFILE_PARAMS={warmup},{profile}",
)


class ProtocolEnv:
    """The `ZEUS_*` variables of one run, parsed and checked.

    Raises:
        ValueError: a variable is missing (only `ZEUS_TARGET_METRIC` is required) or malformed;
            the message names it.

    """

    def __init__(self) -> None:
        self.target_metric = get_env("ZEUS_TARGET_METRIC", float)
        self.log_dir = get_env("ZEUS_LOG_DIR", str, "zeus_log")
        self.job_id = get_env("ZEUS_JOB_ID", str, "zeus")
        self.cost_thresh = get_env("ZEUS_COST_THRESH", float, math.inf)
        self.eta_knob = get_env("ZEUS_ETA_KNOB", float, 0.5)
        self.monitor_path = get_env("ZEUS_MONITOR_PATH", str, "zeus_monitor")
        params = get_env("ZEUS_PROFILE_PARAMS", str, "10,40")
        try:
            warmup, measure = (int(x) for x in params.split(","))
        except ValueError:
            raise ValueError(
                f"ZEUS_PROFILE_PARAMS must be 'warmup,measure' integers, got '{params}'"
            ) from None
        if warmup < 0 or measure <= 0:
            raise ValueError(f"ZEUS_PROFILE_PARAMS must be non-negative, positive; got '{params}'")
        self.warmup_iters = warmup
        self.measure_iters = measure
        self.use_optimal_pl = get_env("ZEUS_USE_OPTIMAL_PL", bool, True)
        if not 0.0 <= self.eta_knob <= 1.0:
            raise ValueError(f"ZEUS_ETA_KNOB must be in [0, 1], got {self.eta_knob}")


def compute_optimal_pl(
    power: dict[int, float], tput: dict[int, float], eta: float, world_size: int = 1
) -> int:
    """The profiled power limit with the least Zeus cost per iteration (the `ZeusCost` selector).

    An iteration at power `P` and throughput `tput` takes `1/tput` seconds and `P/tput` joules,
    so the selector sees one such measurement per power limit, in profiling order.

    Args:
        power: Average power (W, summed over GPUs) at each power limit (mW), highest limit first.
        tput: Throughput (iterations/s) at each power limit.
        eta: Energy/time weight.
        world_size: GPUs whose power is summed in `power`.

    """
    if not power:
        raise ValueError("no power limit was profiled")
    measurements = [
        PowerLimitMeasurement(
            power_limit=pl // 1000, energy=power[pl] / tput[pl], time=1 / tput[pl]
        )
        for pl in power
    ]
    return ZeusCost(eta_knob=eta, world_size=world_size).select(measurements) * 1000


class JobSession:
    """One run of a recurring job, speaking `ZeusMaster`'s protocol.

    Drive it from the training loop::

        s = JobSession(batch_size=bs, max_epochs=me, train_iters=len(train), eval_iters=len(val))
        for epoch in s.epochs():
            s.begin_epoch("train")
            for i in range(len(train)):
                s.before_train_iteration()
                step()
            s.end_epoch("train")
            s.begin_epoch("eval")
            ...
            s.end_epoch("eval")
            s.report_metric(accuracy, higher_is_better=True)

    Args:
        batch_size: Global batch size (per-GPU size times world size).
        max_epochs: Epochs after which the run gives up.
        train_iters: Training iterations per epoch.
        eval_iters: Evaluation iterations per epoch (0 if there is no evaluation).
        world_size: GPUs of a data-parallel job (GPUs `0..world_size-1`).
        rank: This process's rank; only rank 0 measures and writes files.
        sync: Called before reading energy so that queued GPU work is finished.
        decide: For data-parallel jobs: makes rank 0's stop decision known to every rank
            (`decide(stop_on_rank0) -> stop`), so all of them stop together.

    Raises:
        ValueError: bad arguments or protocol environment.
        RuntimeError: too few iterations per epoch to profile power limits.

    """

    def __init__(
        self,
        batch_size: int,
        max_epochs: int,
        train_iters: int,
        eval_iters: int = 0,
        world_size: int = 1,
        rank: int = 0,
        sync: Callable[[], None] | None = None,
        decide: Callable[[bool], bool] | None = None,
    ) -> None:
        for name, v, lo in (
            ("batch_size", batch_size, 1),
            ("max_epochs", max_epochs, 1),
            ("train_iters", train_iters, 1),
            ("eval_iters", eval_iters, 0),
            ("world_size", world_size, 1),
        ):
            if v < lo:
                raise ValueError(f"{name} must be at least {lo}, got {v}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.env = ProtocolEnv()
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.train_iters = train_iters
        self.eval_iters = eval_iters
        self.world_size = world_size
        self.rank = rank
        self._sync = sync
        self._decide = decide
        self.train_json = os.path.join(
            self.env.log_dir, f"{self.env.job_id}+bs{batch_size}.train.json"
        )
        self.power_json = os.path.join(self.env.log_dir, f"bs{batch_size}.power.json")
        self.profiling = not os.path.exists(self.power_json)

        # Profiling window, scaled down when an epoch is too short (as the reference).
        w, p = self.env.warmup_iters, self.env.measure_iters
        if w + p >= train_iters:
            scale = (train_iters - 1) / (w + p)
            w, p = int(w * scale), int(p * scale)
            if p == 0:
                raise RuntimeError(
                    f"{train_iters} iterations per epoch are too few to profile power limits; "
                    "use a smaller batch size"
                )
        self.warmup_iters, self.measure_iters = w, p

        self.epoch_num = 0
        self.target_metric_reached = False
        self.train_epoch_time: list[float] = []
        self.eval_epoch_time: list[float] = []
        self.train_epoch_energy: list[float] = []
        self.eval_epoch_energy: list[float] = []
        self.train_power_result: dict[int, float] = {}
        self.train_tput_result: dict[int, float] = {}
        self.eval_power_result: dict[int, float] = {}
        self.eval_tput_result: dict[int, float] = {}
        self.optimal_pl = 0
        self.current_pl = 0
        self._profiler: PowerLimitProfiler | None = None
        self._phase: str | None = None

        self.gpus: Any = None
        self.monitor: Any = None
        if rank == 0:
            from zeus.device import get_gpus
            from zeus.monitor import ZeusMonitor

            self.gpus = get_gpus()
            if world_size > len(self.gpus):
                raise ValueError(f"world_size {world_size} exceeds the {len(self.gpus)} GPUs")
            min_mw, max_mw = self.gpus.get_power_management_limit_constraints(0)
            self.max_pl = int(max_mw)
            # monitor_path is the legacy binary; it is not a ZeusMonitor argument (§5.4).
            self.monitor = ZeusMonitor(gpu_indices=list(range(world_size)))
            if self.profiling:
                self._profiler = PowerLimitProfiler(
                    self.monitor,
                    int(min_mw),
                    int(max_mw),
                    selector=ZeusCost(eta_knob=self.env.eta_knob, world_size=world_size),
                    set_power_limit=self._set_pl,
                    on_done=self._profiled,
                    name="JobSession",
                    window_prefix=PROFILE_WINDOW_PREFIX,
                    setting_names=_SETTING_NAMES,
                    warmup_steps=self.warmup_iters,
                    profile_steps=self.measure_iters,
                    steps_per_epoch=train_iters,
                    sync=self._sync,
                )
                self.power_limits = self._profiler.power_limits
            else:
                self.power_limits = power_limit_steps(int(min_mw), int(max_mw))
                self._load_power_json()
                self._set_pl(self.optimal_pl if self.env.use_optimal_pl else self.max_pl)
        else:
            self.max_pl = 0
            self.power_limits = []

    # ---- power limits ------------------------------------------------------------------

    def _set_pl(self, pl_mw: int) -> None:
        if self.rank != 0:
            return
        if self._sync is not None:
            self._sync()
        for i in range(self.world_size):
            self.gpus.set_power_management_limit(i, int(pl_mw))
        self.current_pl = int(pl_mw)

    def _load_power_json(self) -> None:
        with open(self.power_json) as f:
            data = json.load(f)

        def ints(d: dict[str, float]) -> dict[int, float]:
            return {int(k): float(v) for k, v in d.items()}

        self.train_power_result = ints(data["train_power"])
        self.train_tput_result = ints(data["train_throughput"])
        self.eval_power_result = ints(data["eval_power"])
        self.eval_tput_result = ints(data["eval_throughput"])
        self.optimal_pl = int(data["optimal_pl"])

    def _save_power_json(self) -> None:
        data = {
            "job_id": self.env.job_id,
            "train_power": self.train_power_result,
            "train_throughput": self.train_tput_result,
            "eval_power": self.eval_power_result,
            "eval_throughput": self.eval_tput_result,
            "optimal_pl": self.optimal_pl,
        }
        _atomic_json(self.power_json, data)

    @property
    def max_power_w(self) -> float:
        """Maximum power of the job's GPUs, W."""
        return self.max_pl // 1000 * self.world_size

    def _profiled(self, optimal_pl: int) -> None:
        """Record the profiled limits and switch to the optimum (the profiler's `on_done`)."""
        if self._profiler is not None:
            # Measurements come in profiling order, one per limit (kept in mW, not rounded to
            # the measurements' watts); each covers `measure_iters` iterations.
            for pl, m in zip(self._profiler.power_limits, self._profiler.measurements):
                self.train_power_result[pl] = m.energy / m.time
                self.train_tput_result[pl] = self.measure_iters / m.time
        self.optimal_pl = optimal_pl
        # Set now, so the following eval epoch is measured at the optimum.
        self._set_pl(self.optimal_pl if self.env.use_optimal_pl else self.max_pl)
        if self.eval_iters == 0:
            # No eval epoch will complete the profile; it is final now.
            self._save_power_json()
            self.profiling = False

    # ---- epochs ------------------------------------------------------------------------

    def _energy(self) -> float:
        return sum(self.train_epoch_energy) + sum(self.eval_epoch_energy)

    def _time(self) -> float:
        return sum(self.train_epoch_time) + sum(self.eval_epoch_time)

    def cost(self) -> float:
        """Cost of the run so far."""
        return zeus_cost(self._energy(), self._time(), self.env.eta_knob, self.max_power_w)

    def _save_train_json(self, reached: bool) -> None:
        if self.rank != 0:
            return
        os.makedirs(self.env.log_dir, exist_ok=True)
        _atomic_json(
            self.train_json,
            {
                "energy": self._energy(),
                "time": self._time(),
                "cost": self.cost(),
                "num_epochs": self.epoch_num,
                "reached": reached,
            },
        )

    def _next_cost(self) -> float:
        pl = self.optimal_pl if self.env.use_optimal_pl else self.max_pl
        # Observer mode runs at the maximum limit, which profiling measured first.
        train_time = self.train_iters / self.train_tput_result[pl]
        eval_time = 0.0
        eval_energy = 0.0
        if self.eval_iters and pl in self.eval_tput_result:
            eval_time = self.eval_iters / self.eval_tput_result[pl]
            eval_energy = eval_time * self.eval_power_result[pl]
        energy = self._energy() + train_time * self.train_power_result[pl] + eval_energy
        time = self._time() + train_time + eval_time
        return zeus_cost(energy, time, self.env.eta_knob, self.max_power_w)

    def epochs(self) -> Iterator[int]:
        """Yield epoch numbers (0, 1, ...) until the target is reached or the run must stop.

        Raises:
            ZeusCostThresholdExceededError: the next epoch is expected to reach the cost
                threshold; train.json (reached=false) has been written. Raised on every rank.

        """
        while True:
            if self.target_metric_reached:
                self._save_train_json(True)
                return
            if self.epoch_num >= self.max_epochs:
                self._save_train_json(False)
                return
            if self.epoch_num == 0:
                yield self.epoch_num
                continue
            stop = False
            err: ZeusCostThresholdExceededError | None = None
            # No prediction while profiling (the optimum is not known yet). Only rank 0 knows
            # when profiling ends, so every rank calls `decide` on every epoch after the first.
            if self.rank == 0 and not self.profiling:
                next_cost = self._next_cost()
                if next_cost >= self.env.cost_thresh:
                    stop = True
                    err = ZeusCostThresholdExceededError(
                        self._time(), self._energy(), self.cost(), next_cost, self.env.cost_thresh
                    )
            if self._decide is not None:
                stop = self._decide(stop)
            if stop:
                self._save_train_json(False)
                if err is None:
                    err = ZeusCostThresholdExceededError(
                        0.0, 0.0, 0.0, math.inf, self.env.cost_thresh
                    )
                raise err
            yield self.epoch_num

    def begin_epoch(self, phase: str) -> None:
        """Start a `train` or `eval` epoch."""
        if phase not in ("train", "eval"):
            raise ValueError(f"phase must be 'train' or 'eval', got '{phase}'")
        if self._phase is not None:
            raise RuntimeError(f"the {self._phase} epoch is still open")
        self._phase = phase
        if phase == "train":
            self.epoch_num += 1
            if not self.profiling:
                self._set_pl(self.optimal_pl if self.env.use_optimal_pl else self.max_pl)
        if self.rank == 0:
            self.monitor.begin_window(EPOCH_WINDOW)

    def end_epoch(self, phase: str) -> None:
        """Finish the open epoch and account its time and energy."""
        if self._phase != phase:
            raise RuntimeError(f"no {phase} epoch is open")
        self._phase = None
        if self.rank != 0:
            return
        if self._sync is not None:
            self._sync()
        if phase == "train" and self.profiling and self._profiler is not None:
            # An epoch that ended inside a warm-up or window drops it; the limit is redone.
            self._profiler.end_epoch()
        m = self.monitor.end_window(EPOCH_WINDOW)
        energy = sum(m.energy.values())
        if phase == "train":
            self.train_epoch_time.append(m.time)
            self.train_epoch_energy.append(energy)
            return
        self.eval_epoch_time.append(m.time)
        self.eval_epoch_energy.append(energy)
        if self.profiling and m.time > 0:
            self.eval_tput_result[self.current_pl] = self.eval_iters / m.time
            self.eval_power_result[self.current_pl] = energy / m.time
            if self.optimal_pl != 0:
                self._save_power_json()
                self.profiling = False

    def before_train_iteration(self) -> None:
        """Call before each training iteration: drives just-in-time power-limit profiling."""
        if self.profiling and self._profiler is not None:
            self._profiler.step()

    def report_metric(self, metric: float, higher_is_better: bool) -> None:
        """Report the validation metric of the epoch."""
        if higher_is_better:
            self.target_metric_reached = metric >= self.env.target_metric
        else:
            self.target_metric_reached = metric <= self.env.target_metric


def _atomic_json(path: str, data: dict[str, Any]) -> None:
    """Write JSON via a temporary file so a reader never sees half a file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
