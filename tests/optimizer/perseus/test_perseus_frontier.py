"""PipelineFrontier (Python side of the Rust frontier) against exhaustive search."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zeus import _core
from zeus.optimizer.perseus.frontier import (
    PipelineFrontier,
    iteration_time,
    pipeline_1f1b,
    stage_instructions,
)

STAGES, MB = 2, 2
FREQS = [1500, 1200, 900]


def exhaustive_best(pf: PipelineFrontier, limit: float) -> float:
    """Least real iteration energy over every per-instruction frequency choice within `limit`."""
    n = len(pf.instructions)
    best = float("inf")
    for choice in itertools.product(range(len(FREQS)), repeat=n):
        plan = pf._make_plan(list(choice))
        if plan.time <= limit + 1e-9:
            best = min(best, plan.energy)
    return best


def test_1f1b_helpers():
    assert stage_instructions(4, 3, 0) == ["forward"] * 3 + ["backward"] * 3
    assert stage_instructions(4, 3, 3) == ["forward", "backward"] * 3
    with pytest.raises(ValueError, match="stage 4"):
        stage_instructions(4, 3, 4)
    with pytest.raises(ValueError, match="at least one stage"):
        pipeline_1f1b(0, 3)
    # forward 1, backward 2 everywhere: (M + S - 1) * 3.
    cost = {"forward": 1.0, "backward": 2.0}
    durations = [[cost[n] for n in stage_instructions(4, 8, s)] for s in range(4)]
    assert iteration_time(8, durations) == 33.0
    with pytest.raises(ValueError, match="stage 1 has 3 durations"):
        iteration_time(2, [[1.0] * 4, [1.0] * 3])


@settings(max_examples=8, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(0, 6), st.integers(0, 6), st.integers(5, 20)),
        min_size=2 * STAGES,
        max_size=2 * STAGES,
    ),
    st.sampled_from([0.0, 1.0]),
)
def test_convex_integer_profiles_give_the_exhaustive_optimum(acts, blocking):
    # Per (stage, kind): times t, t+1, t+2 (integer seconds, so unit_time=1 is exact) with
    # costs whose decrements shrink (convex): then the frontier is the discrete one.
    profiles = []
    for s in range(STAGES):
        prof = {}
        for k, kind in enumerate(("forward", "backward")):
            t, d1, d2, base = acts[2 * s + k]
            d1, d2 = max(d1, d2), min(d1, d2)
            # Energy = effective cost + blocking * time, so the frontier's cost is convex.
            costs = [base + d1 + d2, base + d2, base]
            prof[kind] = {
                f: (float(t + j), costs[j] + blocking * (t + j)) for j, f in enumerate(FREQS)
            }
        profiles.append(prof)
    pf = PipelineFrontier(profiles, MB, blocking_power=blocking, unit_time=1.0)
    best = pf.best_plan(0.0)
    assert best.time <= pf.all_max.time + 1e-9
    assert best.energy == pytest.approx(exhaustive_best(pf, pf.all_max.time))


@settings(max_examples=6, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.floats(0.5, 4.0), st.floats(1.0, 50.0)), min_size=3, max_size=3),
        min_size=2 * STAGES,
        max_size=2 * STAGES,
    ),
    st.sampled_from([0.0, 0.01]),
)
def test_best_plan_is_feasible_and_never_beats_exhaustive(acts, slowdown):
    profiles = []
    for s in range(STAGES):
        prof = {}
        for k, kind in enumerate(("forward", "backward")):
            pts = sorted(acts[2 * s + k])  # fastest first -> highest frequency
            prof[kind] = {f: pts[j] for j, f in enumerate(FREQS)}
        profiles.append(prof)
    pf = PipelineFrontier(profiles, MB, blocking_power=2.0)
    limit = pf.all_max.time * (1 + slowdown)
    best = pf.best_plan(slowdown)
    assert best.time <= limit * (1 + 1e-9)
    assert best.energy <= pf.all_max.energy + 1e-9
    assert best.energy >= exhaustive_best(pf, limit) - 1e-6
    # The plan's predicted time is the DAG's longest path over its instructions.
    durations = []
    for s, plan in enumerate(best.frequencies):
        durations.append([profiles[s][name][f][0] for name, f in plan])
    assert iteration_time(MB, durations) == pytest.approx(best.time)


def test_frontier_binding_errors():
    with pytest.raises(ValueError, match="unit_time"):
        _core.perseus.compute_frontier(1, [], [[(1.0, 1.0)]], -1.0)
    with pytest.raises(ValueError, match="no \\(time, cost\\) options"):
        _core.perseus.compute_frontier(1, [], [[]], 1.0)
    with pytest.raises(ValueError, match="cycle"):
        _core.perseus.compute_frontier(2, [(0, 1), (1, 0)], [[(1.0, 1.0)]] * 2, 1.0)
    f = _core.perseus.compute_frontier(1, [], [[(1.0, 5.0), (3.0, 1.0)]], 1.0)
    assert f.time_units == [3, 2, 1]
    assert f.costs == [1.0, 3.0, 5.0]
    with pytest.raises(ValueError, match="out of range"):
        f.choices(3)
    with pytest.raises(ValueError, match="no 'backward' profile"):
        PipelineFrontier([{"forward": {1: (1.0, 1.0)}}], 1)
