"""Energy-optimal frequency plans of a 1F1B pipeline from instruction profiles.

The algorithms are in the Rust core (`crates/zeus-core/src/optimizer/perseus/`: the
Phillips–Dessouky frontier on the pipeline DAG, the real cost of a plan, and the least-energy
plan within a slowdown, repaired against the unquantised times); this module turns profiles
into its input and its output into per-stage frequency plans.

Cost model (Perseus): when the iteration takes `T`, stage `s` runs its instructions for `busy_s`
seconds and waits, drawing its blocking power `p_s`, for the rest. Iteration energy is

    E = sum_i e_i + sum_s p_s * (T - busy_s)
      = sum_i (e_i - p_{stage(i)} * t_i) + T * sum_s p_s,

so for a fixed `T` each instruction costs `e_i - p * t_i`, and that is what the frontier
minimises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from zeus import _core

__all__ = [
    "FrontierPlan",
    "PipelineFrontier",
    "iteration_time",
    "pipeline_1f1b",
    "stage_instructions",
]

# {"forward" | "backward": {frequency MHz: (seconds, joules)}} for one stage.
StageProfile = Mapping[str, Mapping[int, tuple[float, float]]]


def pipeline_1f1b(
    num_stages: int, num_microbatches: int
) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]:
    """Instructions `(stage, microbatch, name)` and dependency edges of one 1F1B iteration.

    Instructions are numbered stage by stage, each stage in its execution order.

    Raises:
        ValueError: fewer than one stage or microbatch.

    """
    return _core.perseus.pipeline_1f1b(num_stages, num_microbatches)


def stage_instructions(num_stages: int, num_microbatches: int, stage: int) -> list[str]:
    """Instruction names stage `stage` runs in one 1F1B iteration, in order."""
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage} out of range for {num_stages} stages")
    instrs, _ = pipeline_1f1b(num_stages, num_microbatches)
    return [name for s, _, name in instrs if s == stage]


def iteration_time(num_microbatches: int, stage_durations: Sequence[Sequence[float]]) -> float:
    """Iteration time of a 1F1B pipeline given each instruction's duration.

    Args:
        num_microbatches: Microbatches per iteration.
        stage_durations: For each stage, the seconds of its instructions in execution order
            (`2 * num_microbatches` values).

    Raises:
        ValueError: a stage has the wrong number of durations.

    """
    num_stages = len(stage_durations)
    instrs, edges = pipeline_1f1b(num_stages, num_microbatches)
    flat: list[float] = []
    for s, d in enumerate(stage_durations):
        if len(d) != 2 * num_microbatches:
            raise ValueError(f"stage {s} has {len(d)} durations, expected {2 * num_microbatches}")
        flat.extend(float(x) for x in d)
    return _core.perseus.makespan(len(instrs), edges, flat)


@dataclass
class FrontierPlan:
    """A frequency plan and what the profiles predict for it.

    Attributes:
        frequencies: Per stage, the `(instruction, MHz)` sequence of one iteration.
        time: Predicted iteration time (s), from the profiled instruction times.
        energy: Predicted iteration energy (J), blocking energy included.

    """

    frequencies: list[list[tuple[str, int]]]
    time: float
    energy: float


class PipelineFrontier:
    """Iteration time–energy frontier of a 1F1B pipeline.

    Args:
        profiles: Per stage, `{"forward"|"backward": {freq: (seconds, joules)}}`.
        num_microbatches: Microbatches per iteration.
        blocking_power: Watts a waiting GPU draws, one value or one per stage.
        unit_time: Time quantum (s) of the frontier; default 1/500 of the all-max-frequency
            iteration time. Smaller is finer and slower; the chosen plan is repaired against
            the real (unquantised) times either way.

    Raises:
        ValueError: a stage lacks a forward or backward profile, or a value is invalid.

    """

    def __init__(
        self,
        profiles: Sequence[StageProfile],
        num_microbatches: int,
        blocking_power: float | Sequence[float] = 0.0,
        unit_time: float | None = None,
    ) -> None:
        self.num_stages = len(profiles)
        self.num_microbatches = num_microbatches
        if isinstance(blocking_power, (int, float)):
            blocking_power = [float(blocking_power)] * self.num_stages
        if len(blocking_power) != self.num_stages:
            raise ValueError(
                f"blocking_power has {len(blocking_power)} values for {self.num_stages} stages"
            )
        self.blocking_power = [float(p) for p in blocking_power]
        self.instructions, self.edges = pipeline_1f1b(self.num_stages, num_microbatches)
        # Per node: the frequencies in option order (fastest first) and (seconds, joules) at
        # each; the core prices plans, computes the frontier and picks within a slowdown.
        self._freqs: list[list[int]] = []
        options: list[list[tuple[float, float]]] = []
        for stage, _, name in self.instructions:
            prof = profiles[stage].get(name)
            if not prof:
                raise ValueError(f"stage {stage} has no {name!r} profile")
            freqs = sorted(prof, reverse=True)
            self._freqs.append(freqs)
            options.append([(float(prof[f][0]), float(prof[f][1])) for f in freqs])
        self._pipeline = _core.perseus.PerseusPipeline(
            len(self.instructions),
            self.edges,
            [stage for stage, _, _ in self.instructions],
            options,
            self.blocking_power,
            unit_time,
        )
        self.frontier = self._pipeline.frontier
        self.unit_time = self.frontier.unit_time
        self.all_max = self._make_plan([0] * len(self.instructions))

    def _make_plan(self, choices: Sequence[int]) -> FrontierPlan:
        time, energy = self._pipeline.cost(list(choices))
        plan: list[list[tuple[str, int]]] = [[] for _ in range(self.num_stages)]
        for i, ((stage, _, name), c) in enumerate(zip(self.instructions, choices)):
            plan[stage].append((name, self._freqs[i][c]))
        return FrontierPlan(frequencies=plan, time=time, energy=energy)

    def __len__(self) -> int:
        return len(self.frontier)

    def plan(self, k: int) -> FrontierPlan:
        """The real plan of frontier point `k` (0 = slowest, cheapest)."""
        return self._make_plan(self.frontier.choices(k))

    def best_plan(self, slowdown: float = 0.0) -> FrontierPlan:
        """The least-energy plan at most `slowdown` slower than all-max-frequency.

        `slowdown` is a fraction (e.g. 0.01); times are the profiled ones. The frontier's
        times are quantised, so the core repairs its candidates against the real times.

        Raises:
            ValueError: `slowdown` is negative.

        """
        return self._make_plan(self._pipeline.best_within(float(slowdown)))
