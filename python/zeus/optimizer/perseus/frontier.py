"""Energy-optimal frequency plans of a 1F1B pipeline from instruction profiles.

The heavy lifting (the Phillips–Dessouky frontier on the pipeline DAG) is in the Rust core
(`crates/zeus-core/src/optimizer/perseus/`); this module turns profiles into its input and its
output into per-stage frequency plans.

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
    return _core.perseus_pipeline_1f1b(num_stages, num_microbatches)


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
    return _core.perseus_makespan(len(instrs), edges, flat)


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
        # Per node: the frequencies in option order and (seconds, joules) at each.
        self._freqs: list[list[int]] = []
        self._raw: list[list[tuple[float, float]]] = []
        for stage, _, name in self.instructions:
            prof = profiles[stage].get(name)
            if not prof:
                raise ValueError(f"stage {stage} has no {name!r} profile")
            freqs = sorted(prof, reverse=True)
            self._freqs.append(freqs)
            self._raw.append([(float(prof[f][0]), float(prof[f][1])) for f in freqs])
        self.all_max = self._make_plan([0] * len(self.instructions))
        self.unit_time = unit_time if unit_time is not None else self.all_max.time / 500
        options = [
            [(t, e - self.blocking_power[stage] * t) for t, e in raw]
            for (stage, _, _), raw in zip(self.instructions, self._raw)
        ]
        self.frontier = _core.perseus_compute_frontier(
            len(self.instructions), self.edges, options, self.unit_time
        )

    def _make_plan(self, choices: Sequence[int]) -> FrontierPlan:
        durations = [self._raw[i][c][0] for i, c in enumerate(choices)]
        time = _core.perseus_makespan(len(self.instructions), self.edges, durations)
        busy = [0.0] * self.num_stages
        energy = 0.0
        plan: list[list[tuple[str, int]]] = [[] for _ in range(self.num_stages)]
        for i, ((stage, _, name), c) in enumerate(zip(self.instructions, choices)):
            t, e = self._raw[i][c]
            busy[stage] += t
            energy += e
            plan[stage].append((name, self._freqs[i][c]))
        energy += sum(p * (time - b) for p, b in zip(self.blocking_power, busy))
        return FrontierPlan(frequencies=plan, time=time, energy=energy)

    def __len__(self) -> int:
        return len(self.frontier)

    def plan(self, k: int) -> FrontierPlan:
        """The real plan of frontier point `k` (0 = slowest, cheapest)."""
        return self._make_plan(self.frontier.choices(k))

    def best_plan(self, slowdown: float = 0.0) -> FrontierPlan:
        """The least-energy plan at most `slowdown` slower than all-max-frequency.

        `slowdown` is a fraction (e.g. 0.01); times are the profiled ones.

        Raises:
            ValueError: `slowdown` is negative.

        """
        if slowdown < 0:
            raise ValueError(f"slowdown must be >= 0, got {slowdown}")
        limit = self.all_max.time * (1.0 + slowdown)
        # Frontier times are quantised (rounded up), so even its fastest point is slower than
        # the real all-max plan by up to a unit per instruction on the critical path. Pick
        # points against the quantised all-max time, then repair each candidate's real plan
        # until it meets the real limit.
        units = self.frontier.time_units
        limit_units = units[-1] + int(slowdown * self.all_max.time / self.unit_time)
        start = self.frontier.best_within((limit_units + 0.5) * self.unit_time)
        best = self.all_max
        if start is None:
            return best
        for k in range(start, min(start + 16, len(self.frontier))):
            choices = self._repair(self.frontier.choices(k), limit)
            plan = self._make_plan(choices)
            if plan.time <= limit * (1 + 1e-12) and plan.energy < best.energy:
                best = plan
        return best

    def _critical_path(self, durations: list[float]) -> list[int]:
        n = len(durations)
        preds: list[list[int]] = [[] for _ in range(n)]
        for a, b in self.edges:
            preds[b].append(a)
        finish = [0.0] * n
        via = [-1] * n
        # Nodes are numbered stage by stage, which is not a dependency order.
        order = self._topological_order()
        for v in order:
            start = 0.0
            for p in preds[v]:
                if finish[p] > start:
                    start, via[v] = finish[p], p
            finish[v] = start + durations[v]
        v = max(range(n), key=lambda i: finish[i])
        path = []
        while v >= 0:
            path.append(v)
            v = via[v]
        return path

    def _topological_order(self) -> list[int]:
        if not hasattr(self, "_topo"):
            n = len(self.instructions)
            indeg = [0] * n
            succ: list[list[int]] = [[] for _ in range(n)]
            for a, b in self.edges:
                succ[a].append(b)
                indeg[b] += 1
            order = [v for v in range(n) if indeg[v] == 0]
            for v in order:
                for w in succ[v]:
                    indeg[w] -= 1
                    if indeg[w] == 0:
                        order.append(w)
            self._topo = order
        return self._topo

    def _repair(self, choices: list[int], limit: float) -> list[int]:
        """Speed up instructions on the real critical path until the plan meets `limit`.

        Each step moves the critical instruction with the cheapest extra cost per second saved
        to its next faster option. All-max meets the limit, so this ends.
        """
        choices = list(choices)
        while True:
            durations = [self._raw[i][c][0] for i, c in enumerate(choices)]
            if _core.perseus_makespan(len(choices), self.edges, durations) <= limit:
                return choices
            best_i, best_rate = -1, float("inf")
            for i in self._critical_path(durations):
                c = choices[i]
                if c == 0:
                    continue
                (t0, e0), (t1, e1) = self._raw[i][c - 1], self._raw[i][c]
                stage = self.instructions[i][0]
                saved = t1 - t0
                extra = (e0 - self.blocking_power[stage] * t0) - (
                    e1 - self.blocking_power[stage] * t1
                )
                rate = extra / saved if saved > 0 else float("inf")
                if rate < best_rate:
                    best_i, best_rate = i, rate
            if best_i < 0:
                return choices
            choices[best_i] -= 1
