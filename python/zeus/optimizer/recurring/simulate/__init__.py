"""Trace-driven simulation of recurring jobs (the Zeus NSDI'23 evaluation).

The traces are parsed once into per-job tables in Rust (`zeus._core.recurring.SimTable`), and each
recurrence is simulated by the Rust loop. `simulate` (the CLI) runs the Zeus policy and the
baseline entirely in Rust; `Simulator` calls the policy objects it is given back from that loop
(the built-in ones decide through the same Rust policy, `zeus._core.recurring.PruningGts` and
`zeus._core.recurring.JitPowerLimit`).

Differences from the reference simulator, on purpose:

- None in the decisions: training paths are drawn and the Zeus policy decides through
  `zeus._core.recurring.NumpyRng`, numpy's `default_rng(seed)` draw for draw, so a seed gives the
  reference's trajectory run for run.
- The default batch size is clamped to the largest batch size of the trace (as the reference's
  Alibaba driver does per GPU), and batch sizes without any run at the job's target metric are
  left out (the reference would crash sampling from them).
- The baseline (`policy="default"`) is deterministic: each recurrence costs the expectation over
  the trace's training paths at the default batch size and the maximum power limit.

The published Zeus traces (`summary_train.csv`, `summary_power_a40.csv`,
`summary_power_v100.csv`; Apache-2.0, from github.com/ml-energy/zeus) ship with the package in
`TRACE_DIR`; `load_table`, `simulate` and `python -m zeus.simulate` read them when no trace
directory is given.
"""

from __future__ import annotations

import copy
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from zeus._core.recurring import SimTable
from zeus.optimizer.recurring.job import HistoryEntry, Job
from zeus.optimizer.recurring.policy.interface import BatchSizeOptimizer, PowerLimitOptimizer
from zeus.util.metric import zeus_cost

__all__ = [
    "Simulator",
    "HistoryEntry",
    "SimulationResult",
    "simulate",
    "builtin_job",
    "WORKLOADS",
    "load_table",
    "TRACE_DIR",
]

#: The Zeus traces shipped with the package (see the `README.md` and `LICENSE` in it).
TRACE_DIR: Path = Path(__file__).resolve().parent / "traces"

_TraceDir = Optional[Union[str, os.PathLike[str]]]


def _trace_dir(trace_dir: _TraceDir) -> str:
    """`trace_dir` as a string, or the shipped traces' directory when it is `None`."""
    return os.fspath(TRACE_DIR if trace_dir is None else trace_dir)


# (rec, try, batch_size, power_limit, energy, time, reached) rows from the core.
_Row = tuple[int, int, int, int, float, float, bool]

#: The six paper workloads: dataset -> (network, optimizer, target metric, max epochs, b0).
WORKLOADS: dict[str, tuple[str, str, float, int, int]] = {
    w[0]: (w[1], w[2], w[3], w[4], w[5]) for w in SimTable.builtin_workloads()
}


def builtin_job(workload: str) -> Job:
    """The `Job` of one of the six paper workloads (default batch size not clamped).

    Raises:
        ValueError: unknown workload.

    """
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload '{workload}'; known workloads: {', '.join(WORKLOADS)}")
    net, opt, tm, me, b0 = WORKLOADS[workload]
    return Job(workload, net, opt, tm, me, default_bs=b0)


def load_table(trace_dir: _TraceDir, gpu: str, workload: str) -> SimTable:
    """The trace table of a built-in workload on `gpu` (`summary_power_<gpu>.csv` in `trace_dir`).

    Args:
        trace_dir: Directory with `summary_train.csv` and `summary_power_<gpu>.csv`; `None`
            for the traces shipped with zeus (`TRACE_DIR`).
        gpu: GPU name (any with a power trace in the directory).
        workload: One of `WORKLOADS`.

    Raises:
        FileNotFoundError: `summary_train.csv` is missing.
        ValueError: unknown workload or GPU, or a malformed trace (the message names the file,
            line, column and value).

    """
    return SimTable.builtin(_trace_dir(trace_dir), gpu, workload)


def _source(value: Any, name: str) -> dict[str, str]:
    """A trace given as a path or a DataFrame, as SimTable keyword arguments."""
    if isinstance(value, (str, os.PathLike)):
        return {f"{name}_path": os.fspath(value)}
    if hasattr(value, "to_csv"):
        return {f"{name}_text": value.to_csv(index=False)}
    raise ValueError(f"summary_{name} must be a path or a DataFrame, got {type(value).__name__}")


def _entries(rows: list[_Row]) -> list[HistoryEntry]:
    return [HistoryEntry(bs, pl, e, reached, t) for _, _, bs, pl, e, t, reached in rows]


class Simulator:
    """Simulate recurring jobs over the Zeus traces (the reference's `Simulator`).

    Args:
        summary_train: Path to `summary_train.csv`, or a DataFrame of it.
        summary_power: Path to `summary_power_<gpu>.csv`, or a DataFrame of it.
        batch_size_optimizer: The batch-size policy.
        power_limit_optimizer: The power-limit policy.
        seed: Seed of the training-path sampler (the batch-size optimizer has its own).
        verbose: Kept for the reference's signature; the policy objects' own `verbose`
            decides what they print.

    """

    def __init__(
        self,
        summary_train: str | os.PathLike[str] | Any,
        summary_power: str | os.PathLike[str] | Any,
        batch_size_optimizer: BatchSizeOptimizer,
        power_limit_optimizer: PowerLimitOptimizer,
        seed: int = 123456,
        verbose: bool = True,
    ) -> None:
        self._train = _source(summary_train, "train")
        self._power = _source(summary_power, "power")
        self.bso = batch_size_optimizer
        self.plo = power_limit_optimizer
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.seed = seed
        self.verbose = verbose
        self._tables: dict[Job, SimTable] = {}

    def table(self, job: Job) -> SimTable:
        """The (cached) trace table of `job`."""
        if job not in self._tables:
            self._tables[job] = SimTable(
                job.dataset,
                job.network,
                job.optimizer,
                float(job.target_metric),
                int(job.max_epochs),
                job.default_bs,
                **self._train,
                **self._power,
            )
        return self._tables[job]

    def simulate_one_job(
        self, job: Job, num_recurrence: int, beta_knob: float, eta_knob: float
    ) -> list[HistoryEntry]:
        """Simulate `num_recurrence` recurrences of `job`; one entry per run.

        Args:
            job: The job (dataset, network, optimizer, target metric, max epochs, default bs).
            num_recurrence: Number of recurrences.
            beta_knob: Early-stop factor; `inf` disables early stopping.
            eta_knob: Energy/time weight in [0, 1].

        Raises:
            ValueError: bad knobs, or the traces have nothing for the job.
            RuntimeError: the default batch size misses the target, or a recurrence needs more
                than 20 tries.

        """
        return _entries(self.simulate_rows(job, num_recurrence, beta_knob, eta_knob))

    def simulate_rows(
        self, job: Job, num_recurrence: int, beta_knob: float, eta_knob: float
    ) -> list[_Row]:
        """Like `simulate_one_job`, but rows with recurrence and try numbers.

        Each row is `(rec, try, batch_size, power_limit, energy, time, reached)`.
        """
        if num_recurrence < 1:
            raise ValueError(f"num_recurrence must be at least 1, got {num_recurrence}")
        table = self.table(job)
        # Keep the user's objects untouched, as the reference does.
        bso = copy.deepcopy(self.bso)
        plo = copy.deepcopy(self.plo)
        bso.register_job(job, table.batch_sizes)
        return table.simulate_with(
            job,
            bso,
            plo,
            self.seed,
            float(eta_knob),
            float(beta_knob),
            int(num_recurrence),
        )


@dataclass
class SimulationResult:
    """Totals of one simulation (what the CLI prints)."""

    gpu: str
    workload: str
    policy: str
    seed: int
    recurrences: int
    energy: float
    time: float
    cost: float
    final_batch_size: int
    final_power_limit: int

    def to_dict(self) -> dict[str, Any]:
        """As a plain dict."""
        return asdict(self)


def simulate(
    trace_dir: _TraceDir,
    gpu: str,
    workload: str,
    policy: Literal["zeus", "default"] = "zeus",
    seed: int = 123456,
    eta: float = 0.5,
    beta: float = 2.0,
    recurrences: int | None = None,
    table: SimTable | None = None,
) -> tuple[SimulationResult, list[_Row]]:
    """Simulate a built-in workload on `gpu` with the Zeus policy or the baseline.

    Args:
        trace_dir: Directory with `summary_train.csv` and `summary_power_<gpu>.csv`; `None`
            for the traces shipped with zeus (`TRACE_DIR`).
        gpu: GPU name (any with a power trace).
        workload: One of `WORKLOADS`.
        policy: `zeus` or `default` (default batch size, maximum power limit, no early stop).
        seed: Seed.
        eta: Energy/time weight in [0, 1].
        beta: Early-stop factor of the Zeus policy.
        recurrences: Number of recurrences; default 2·|batch sizes|·|power limits|.
        table: A table already loaded with `load_table` (skips parsing).

    Returns:
        The totals and the per-run rows `(rec, try, bs, pl, energy, time, reached)`.

    Raises:
        ValueError: unknown policy, workload or GPU, malformed trace, bad knobs.

    """
    if policy not in ("zeus", "default"):
        raise ValueError(f"unknown policy '{policy}'; use 'zeus' or 'default'")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    t = table if table is not None else load_table(trace_dir, gpu, workload)
    n = t.default_recurrences if recurrences is None else recurrences
    if n < 1:
        raise ValueError(f"recurrences must be at least 1, got {n}")
    if policy == "zeus":
        rows = t.simulate_zeus(seed, float(eta), float(beta), n)
    else:
        rows = t.simulate_default(seed, float(eta), n)
    energy = sum(r[4] for r in rows)
    time = sum(r[5] for r in rows)
    cost = sum(zeus_cost(r[4], r[5], eta, t.max_power) for r in rows)
    last = rows[-1]
    result = SimulationResult(
        gpu=gpu,
        workload=workload,
        policy=policy,
        seed=seed,
        recurrences=n,
        energy=energy,
        time=time,
        cost=cost,
        final_batch_size=last[2],
        final_power_limit=last[3],
    )
    return result, rows
