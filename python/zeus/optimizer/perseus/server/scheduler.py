"""Frequency schedulers: the frequency of each rank's instructions, iteration by iteration.

A scheduler is a generator (`_run`) that yields one list of `FrequencySchedule` (one per rank)
and receives the ranks' `ProfilingResult`s of that schedule back. `PERSEUS_SCHEDULER` names one
of the classes here; `PERSEUS_SCHEDULER_ARGS` gives its extra constructor arguments.

Schedulers:
    AllMaxFrequency: every instruction at the highest frequency.
    PointSolution: replays a plan read from a JSON file (the reference `eval`s a `.py` file;
        JSON is parsed, never executed).
    InstructionProfiler: runs every instruction at each frequency in turn and writes the
        instruction profile (CSV), then runs at the highest frequency.
    EnergyOptimal: profiles (or reads a profile), computes the time–energy frontier and runs
        the least-energy plan that is not slower than all-max-frequency (or within a budget).
"""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Generator, Sequence

from zeus.optimizer.perseus.common import (
    FrequencySchedule,
    InstructionProfilingResult,
    JobInfo,
    OfflineProfilingResult,
    ProfilingResult,
    RankInfo,
)
from zeus.optimizer.perseus.frontier import FrontierPlan, PipelineFrontier, stage_instructions
from zeus.util.logging import get_logger

if TYPE_CHECKING:
    # Type-only: the settings resolve scheduler names against this module.
    from zeus.optimizer.perseus.server.config import PerseusSettings

__all__ = [
    "AllMaxFrequency",
    "AllMaxFrequency3D",
    "EnergyOptimal",
    "EnergyOptimal3D",
    "FrequencyScheduler",
    "InstructionProfiler",
    "InstructionProfiler3D",
    "PointSolution",
    "PointSolution3D",
    "make_3d_parallel",
]

logger = get_logger(__name__)

ScheduleGen = Generator[list[FrequencySchedule], list[ProfilingResult], None]


class FrequencyScheduler(ABC):
    """Base class: drives the `_run` generator.

    Args:
        job_info: The job.
        rank_infos: Its ranks, sorted by rank.
        perseus_settings: Server settings (for the dump directory and the like).

    """

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
    ) -> None:
        """Start the generator lazily."""
        self.job_info = job_info
        self.rank_infos = rank_infos
        self.world_size = job_info.world_size
        self.perseus_settings = perseus_settings
        self._generator = self._run()
        self._next_schedule: list[FrequencySchedule] | None = None

    def next_schedule(self) -> list[FrequencySchedule]:
        """The schedule to run next (the same one until `observe` is called).

        Raises:
            RuntimeError: the generator yielded nothing at all.

        """
        if self._next_schedule is None:
            try:
                self._next_schedule = next(self._generator)
            except StopIteration as e:
                raise RuntimeError(f"{type(self).__name__} generated no schedule at all") from e
        return self._next_schedule

    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        """Feed back the results of the last schedule.

        When the generator is done, the last schedule keeps being served.
        """
        try:
            self._next_schedule = self._generator.send(profiling_results)
        except StopIteration:
            pass

    @abstractmethod
    def _run(self) -> ScheduleGen:
        """Yield schedules; receive profiling results."""

    # Helpers shared by the pipeline schedulers.
    def _stage_of(self, info: RankInfo) -> int:
        return info.pp_rank

    def _uniform(
        self, num_microbatches: int, freq_of_rank: dict[int, int]
    ) -> list[FrequencySchedule]:
        out = []
        for info in self.rank_infos:
            names = stage_instructions(
                self.job_info.pp_degree, num_microbatches, self._stage_of(info)
            )
            f = freq_of_rank[info.rank]
            out.append(FrequencySchedule(rank=info.rank, frequencies=[(n, f) for n in names]))
        return out

    def _all_max_frequency(self, num_microbatches: int) -> list[FrequencySchedule]:
        """Every instruction of every rank at that rank's highest frequency."""
        return self._uniform(
            num_microbatches, {i.rank: max(i.available_frequencies) for i in self.rank_infos}
        )


def make_3d_parallel(
    sched_cls: type[FrequencyScheduler], name: str | None = None
) -> type[FrequencyScheduler]:
    """Wrap a pipeline-only scheduler for 3D parallelism.

    The wrapped scheduler sees one rank per pipeline stage; results are merged per stage
    (times by maximum, energies by sum, element-wise) and each stage's schedule is copied to
    every rank of the stage. Unlike the reference, the per-stage rank infos are really passed on.
    """

    class Wrapper(sched_cls):  # type: ignore[valid-type,misc]
        def __init__(
            self,
            job_info: JobInfo,
            rank_infos: list[RankInfo],
            perseus_settings: PerseusSettings,
            *args,
            **kwargs,
        ) -> None:
            self._orig_job_info = job_info
            self._orig_rank_infos = rank_infos
            pp = job_info.pp_degree
            new_job = JobInfo(pp_degree=pp, dp_degree=1, tp_degree=1, world_size=pp)
            new_job.job_id = job_info.job_id
            by_stage: dict[int, RankInfo] = {}
            for info in rank_infos:
                by_stage.setdefault(info.pp_rank, info)
            new_ranks = [
                RankInfo(
                    rank=s,
                    dp_rank=0,
                    pp_rank=s,
                    tp_rank=0,
                    available_frequencies=by_stage[s].available_frequencies,
                )
                for s in range(pp)
            ]
            super().__init__(new_job, new_ranks, perseus_settings, *args, **kwargs)

        def observe(self, profiling_results: list[ProfilingResult]) -> None:
            stage_of = {i.rank: i.pp_rank for i in self._orig_rank_infos}
            merged: dict[int, ProfilingResult] = {}
            for res in profiling_results:
                s = stage_of[res.rank]
                if s not in merged:
                    merged[s] = res.model_copy(deep=True, update={"rank": s})
                    continue
                m = merged[s]
                m.iter_time = [max(a, b) for a, b in zip(m.iter_time, res.iter_time)]
                m.iter_energy = [a + b for a, b in zip(m.iter_energy, res.iter_energy)]
                for key, vals in res.time_breakdown.items():
                    m.time_breakdown[key] = [
                        [max(a, b) for a, b in zip(x, y)]
                        for x, y in zip(m.time_breakdown.get(key, vals), vals)
                    ]
                for key, vals in res.energy_breakdown.items():
                    m.energy_breakdown[key] = [
                        [a + b for a, b in zip(x, y)]
                        for x, y in zip(m.energy_breakdown.get(key, vals), vals)
                    ]
            super().observe([merged[s] for s in sorted(merged)])

        def next_schedule(self) -> list[FrequencySchedule]:
            stage_sched = {s.rank: s for s in super().next_schedule()}
            return [
                FrequencySchedule(rank=info.rank, frequencies=stage_sched[info.pp_rank].frequencies)
                for info in self._orig_rank_infos
            ]

    Wrapper.__name__ = name or f"{sched_cls.__name__}3D"
    Wrapper.__qualname__ = Wrapper.__name__
    # So that PerseusSettings checks PERSEUS_SCHEDULER_ARGS against the real parameters.
    Wrapper.__signature__ = inspect.signature(sched_cls)  # type: ignore[attr-defined]
    return Wrapper


def _microbatches(job_info: JobInfo, given: int | None, scheduler: str) -> int:
    """The scheduler's `num_microbatches` argument, else the job's, checked."""
    n = given if given is not None else job_info.num_microbatches
    if n is None:
        raise ValueError(
            f"{scheduler} needs the number of microbatches per iteration: pass "
            "num_microbatches= to PerseusOptimizer, or set "
            "PERSEUS_SCHEDULER_ARGS='{\"num_microbatches\": N}'"
        )
    if n < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {n}")
    return n


class AllMaxFrequency(FrequencyScheduler):
    """Every forward and backward of the 1F1B schedule at the rank's highest frequency.

    The server's default scheduler: it needs no argument.

    Args:
        num_microbatches: Microbatches per iteration; default the job's (`JobInfo`).

    """

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        num_microbatches: int | None = None,
    ) -> None:
        """Check the arguments."""
        self.num_microbatches = _microbatches(job_info, num_microbatches, "AllMaxFrequency")
        super().__init__(job_info, rank_infos, perseus_settings)

    def _run(self) -> ScheduleGen:
        yield self._all_max_frequency(self.num_microbatches)


class PointSolution(FrequencyScheduler):
    """Replays one plan from a JSON file, forever.

    The file holds, per rank in rank order, the list of `[instruction, MHz]` pairs of one
    iteration: `[[["forward", 1410], ["backward", 1200], ...], ...]`. The reference reads a
    `.py` file with `eval`, which runs arbitrary code; JSON is parsed only.

    Args:
        solution_path: Path of the `.json` plan.

    Raises:
        ValueError: the file is missing, not `.json`, malformed, or has the wrong number of
            ranks.

    """

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        solution_path: str,
    ) -> None:
        """Read and check the plan."""
        path = Path(solution_path)
        if path.suffix != ".json":
            raise ValueError(f"solution_path must be a .json file, got {solution_path!r}")
        if not path.is_file():
            raise ValueError(f"solution_path {solution_path!r} does not exist")
        try:
            plan = json.loads(path.read_text())
            self.schedule = [
                [(str(name), int(freq)) for name, freq in rank_plan] for rank_plan in plan
            ]
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"{solution_path}: expected a list of [instruction, frequency] lists ({e})"
            ) from e
        if len(self.schedule) != job_info.world_size:
            raise ValueError(
                f"{solution_path} has plans for {len(self.schedule)} ranks, "
                f"the job has {job_info.world_size}"
            )
        super().__init__(job_info, rank_infos, perseus_settings)

    def _run(self) -> ScheduleGen:
        yield [
            FrequencySchedule(rank=r, frequencies=freqs) for r, freqs in enumerate(self.schedule)
        ]


PointSolution3D = make_3d_parallel(PointSolution)


def _pick_frequencies(
    available: Sequence[int], frequencies: Sequence[int] | None, num_frequencies: int | None
) -> list[int]:
    avail = sorted(set(available), reverse=True)
    if frequencies is not None:
        bad = sorted(set(frequencies) - set(avail))
        if bad:
            raise ValueError(f"frequencies {bad} are not supported by the GPU")
        return sorted(set(frequencies), reverse=True)
    if num_frequencies is None or num_frequencies >= len(avail):
        return avail
    if num_frequencies < 2:
        raise ValueError(f"num_frequencies must be >= 2, got {num_frequencies}")
    # Evenly spaced over the list, always including the highest and the lowest.
    step = (len(avail) - 1) / (num_frequencies - 1)
    return sorted({avail[round(k * step)] for k in range(num_frequencies)}, reverse=True)


class InstructionProfiler(FrequencyScheduler):
    """Measures each stage's forward and backward at each frequency.

    For each frequency (highest first), every instruction of every rank runs at it for
    `warmup_iters + profile_iters` iterations; the per-instruction times and energies of the
    last `profile_iters` are averaged. The result (`InstructionProfilingResult`) is written to
    `output_path` (default `{dump_dir}/{job_id}/instruction_profile.csv`); then every
    instruction runs at the highest frequency.

    Args:
        num_microbatches: Microbatches per iteration; default the job's (`JobInfo`).
        frequencies: Frequencies to profile (MHz); default all the GPU supports.
        num_frequencies: Profile only this many, evenly spaced (ignored with `frequencies`).
        warmup_iters: Iterations per frequency that are not measured.
        profile_iters: Iterations per frequency that are measured.
        output_path: Where to write the CSV.

    """

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        num_microbatches: int | None = None,
        frequencies: list[int] | None = None,
        num_frequencies: int | None = None,
        warmup_iters: int = 1,
        profile_iters: int = 1,
        output_path: str | None = None,
    ) -> None:
        """Check the arguments and choose the frequencies."""
        num_microbatches = _microbatches(job_info, num_microbatches, type(self).__name__)
        if warmup_iters < 0 or profile_iters < 1:
            raise ValueError(
                f"need warmup_iters >= 0 and profile_iters >= 1, got {warmup_iters}, "
                f"{profile_iters}"
            )
        self.num_microbatches = num_microbatches
        self.warmup_iters = warmup_iters
        self.profile_iters = profile_iters
        self.output_path = output_path
        self.frequencies = {
            i.rank: _pick_frequencies(i.available_frequencies, frequencies, num_frequencies)
            for i in rank_infos
        }
        lengths = {len(f) for f in self.frequencies.values()}
        if len(lengths) != 1:
            raise ValueError("every rank must profile the same number of frequencies")
        self.result: InstructionProfilingResult | None = None
        super().__init__(job_info, rank_infos, perseus_settings)

    def _profile(self) -> Generator[list[FrequencySchedule], list[ProfilingResult], None]:
        # samples[rank][name][freq] -> list of (time, energy) per occurrence
        samples: dict[int, dict[str, dict[int, list[tuple[float, float]]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list))
        )
        num = len(next(iter(self.frequencies.values())))
        for k in range(num):
            freq_of = {r: f[k] for r, f in self.frequencies.items()}
            sched = self._uniform(self.num_microbatches, freq_of)
            for it in range(self.warmup_iters + self.profile_iters):
                results = yield sched
                if it < self.warmup_iters:
                    continue
                for res in results:
                    for name, iters in res.time_breakdown.items():
                        energies = res.energy_breakdown.get(name, [])
                        for times, ens in zip(iters, energies):
                            for t, e in zip(times, ens):
                                samples[res.rank][name][freq_of[res.rank]].append((t, e))
        profiles = []
        for info in self.rank_infos:
            per = samples[info.rank]
            fields: dict[str, dict[int, float]] = {}
            for name in ("forward", "backward"):
                if not per.get(name):
                    raise ValueError(
                        f"rank {info.rank} reported no {name!r} measurements; the client "
                        "must report time_breakdown and energy_breakdown"
                    )
                fields[f"{name}_time"] = {
                    f: sum(t for t, _ in v) / len(v) for f, v in per[name].items()
                }
                fields[f"{name}_energy"] = {
                    f: sum(e for _, e in v) / len(v) for f, v in per[name].items()
                }
            profiles.append(
                OfflineProfilingResult(
                    rank=info.rank,
                    dp_rank=info.dp_rank,
                    pp_rank=info.pp_rank,
                    tp_rank=info.tp_rank,
                    **fields,
                )
            )
        self.result = InstructionProfilingResult(profiles)
        path = Path(
            self.output_path
            or Path(self.perseus_settings.dump_dir)
            / (self.job_info.job_id or "job")
            / "instruction_profile.csv"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        self.result.to_csv(path)
        logger.info("Instruction profile written to %s", path)

    def _run(self) -> ScheduleGen:
        yield from self._profile()
        yield self._all_max_frequency(self.num_microbatches)


class EnergyOptimal(InstructionProfiler):
    """Least-energy plan that does not slow the iteration down (Perseus).

    Profiles the instructions (as `InstructionProfiler`) unless `profile_path` gives a CSV it
    wrote, computes the iteration time–energy frontier of the 1F1B DAG (Phillips–Dessouky, in
    the Rust core), and runs the least-energy plan whose predicted iteration time is at most
    `(1 + slowdown)` times that of running everything at the highest frequency.

    Args:
        num_microbatches: Microbatches per iteration.
        slowdown: Allowed iteration slowdown, a fraction (0 = none).
        profile_path: An instruction profile CSV; skips profiling.
        blocking_power: Watts a waiting GPU draws (one value, or one per stage); default the
            mean `blocking_power` the ranks reported, else 0.
        unit_time: Time quantum (s) of the frontier; see `PipelineFrontier`.
        frequencies, num_frequencies, warmup_iters, profile_iters, output_path: as for
            `InstructionProfiler`.

    """

    def __init__(
        self,
        job_info: JobInfo,
        rank_infos: list[RankInfo],
        perseus_settings: PerseusSettings,
        num_microbatches: int | None = None,
        slowdown: float = 0.0,
        profile_path: str | None = None,
        blocking_power: float | list[float] | None = None,
        unit_time: float | None = None,
        frequencies: list[int] | None = None,
        num_frequencies: int | None = None,
        warmup_iters: int = 1,
        profile_iters: int = 1,
        output_path: str | None = None,
    ) -> None:
        """Check the arguments; read the profile if given."""
        if slowdown < 0:
            raise ValueError(f"slowdown must be >= 0, got {slowdown}")
        if job_info.world_size != job_info.pp_degree:
            raise ValueError(
                "EnergyOptimal plans pure pipeline parallelism (world_size == pp_degree); "
                "wrap it with make_3d_parallel for data/tensor parallelism"
            )
        self.slowdown = slowdown
        self.blocking_power = blocking_power
        self.unit_time = unit_time
        # Set by `_run` once the frontier is computed.
        self.plan: FrontierPlan | None = None
        self.all_max_plan: FrontierPlan | None = None
        super().__init__(
            job_info,
            rank_infos,
            perseus_settings,
            num_microbatches,
            frequencies,
            num_frequencies,
            warmup_iters,
            profile_iters,
            output_path,
        )
        if profile_path is not None:
            self.result = InstructionProfilingResult.from_csv(profile_path)
        self._reported_power: dict[int, list[float]] = defaultdict(list)

    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        """Remember reported blocking power, then advance."""
        for res in profiling_results:
            if res.blocking_power is not None:
                self._reported_power[res.rank].append(res.blocking_power)
        super().observe(profiling_results)

    def _blocking_power(self) -> list[float]:
        stages = self.job_info.pp_degree
        if self.blocking_power is not None:
            if isinstance(self.blocking_power, (int, float)):
                return [float(self.blocking_power)] * stages
            return [float(p) for p in self.blocking_power]
        out = [0.0] * stages
        for info in self.rank_infos:
            vals = self._reported_power.get(info.rank)
            if vals:
                out[info.pp_rank] = sum(vals) / len(vals)
        return out

    def _run(self) -> ScheduleGen:
        if self.result is None:
            yield from self._profile()
        assert self.result is not None
        by_stage = {r.pp_rank: r for r in self.result.root}
        missing = sorted(set(range(self.job_info.pp_degree)) - set(by_stage))
        if missing:
            raise ValueError(f"the instruction profile has no data for stages {missing}")
        profiles = [
            {
                kind: {
                    f: (getattr(p, f"{kind}_time")[f], getattr(p, f"{kind}_energy")[f])
                    for f in getattr(p, f"{kind}_time")
                }
                for kind in ("forward", "backward")
            }
            for p in (by_stage[s] for s in range(self.job_info.pp_degree))
        ]
        frontier = PipelineFrontier(
            profiles,
            self.num_microbatches,
            blocking_power=self._blocking_power(),
            unit_time=self.unit_time,
        )
        all_max = frontier.all_max
        plan = frontier.best_plan(self.slowdown)
        self.all_max_plan = all_max
        self.plan = plan
        logger.info(
            "Perseus plan: predicted %.4f s / %.2f J per iteration (all max frequency: "
            "%.4f s / %.2f J), frontier of %d points",
            plan.time,
            plan.energy,
            all_max.time,
            all_max.energy,
            len(frontier),
        )
        yield [
            FrequencySchedule(rank=info.rank, frequencies=plan.frequencies[info.pp_rank])
            for info in self.rank_infos
        ]


AllMaxFrequency3D = make_3d_parallel(AllMaxFrequency)
InstructionProfiler3D = make_3d_parallel(InstructionProfiler)
EnergyOptimal3D = make_3d_parallel(EnergyOptimal)
