"""Optimum selectors against the twelve measured profiles and an independent computation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from plo_helpers import load_profile, profile_params, zeus_cost_choice
from zeus.optimizer.power_limit import (
    Energy,
    MaxSlowdownConstraint,
    OptimumSelector,
    PowerLimitMeasurement,
    Time,
    ZeusCost,
)


def measurements(rows: list[tuple[int, float, float]]) -> list[PowerLimitMeasurement]:
    return [PowerLimitMeasurement(power_limit=pl, energy=e, time=t) for pl, e, t in rows]


def first_argmin(rows: list[tuple[int, float, float]], key: int) -> int:
    best = rows[0]
    for r in rows[1:]:
        if r[key] < best[key]:
            best = r
    return best[0]


def slowdown_choice(rows: list[tuple[int, float, float]], factor: float) -> int:
    top = max(rows, key=lambda r: r[0])
    return min(pl for pl, _, t in rows if t <= factor * top[2])


@pytest.mark.parametrize("path", profile_params())
def test_selectors_on_measured_profiles(path: Path) -> None:
    prof = load_profile(path)
    world = len(prof.gpu_indices)
    ms = measurements(prof.rows)
    assert [m.power_limit for m in ms] == sorted((m.power_limit for m in ms), reverse=True)

    for eta in (0.0, 0.25, 0.5, 0.75, 1.0):
        got = ZeusCost(eta_knob=eta, world_size=world).select(ms)
        assert got == zeus_cost_choice(prof.rows, eta, world), (path.name, eta)
    assert Energy().select(ms) == first_argmin(prof.rows, 1)
    assert Time().select(ms) == first_argmin(prof.rows, 2)
    for factor in (1.0, 1.1, 1.2, 1.5):
        got = MaxSlowdownConstraint(factor=factor).select(ms)
        assert got == slowdown_choice(prof.rows, factor), (path.name, factor)
    # The extremes of the knob are the single-objective selectors.
    assert ZeusCost(1.0, world).select(ms) == Energy().select(ms)
    assert ZeusCost(0.0, world).select(ms) == Time().select(ms)


def test_ties_go_to_the_first_in_profiling_order() -> None:
    ms = measurements([(300, 10.0, 1.0), (250, 10.0, 1.0), (200, 10.0, 1.0)])
    for sel in (Energy(), Time(), ZeusCost(0.5), ZeusCost(1.0), ZeusCost(0.0)):
        assert sel.select(ms) == 300, sel


def test_max_slowdown_baseline_is_the_highest_limit_not_the_fastest() -> None:
    ms = measurements([(300, 5.0, 10.0), (250, 5.0, 9.0), (200, 5.0, 10.5)])
    assert MaxSlowdownConstraint(1.0).select(ms) == 250
    assert MaxSlowdownConstraint(1.05).select(ms) == 200


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: ZeusCost(eta_knob=-0.1), "-0.1"),
        (lambda: ZeusCost(eta_knob=1.5), "1.5"),
        (lambda: ZeusCost(eta_knob=0.5, world_size=0), "0"),
        (lambda: ZeusCost(eta_knob=0.5, world_size=2.5), "2.5"),
        (lambda: MaxSlowdownConstraint(factor=0.9), "0.9"),
        (lambda: MaxSlowdownConstraint(factor=float("nan")), "NaN"),
    ],
)
def test_bad_parameters_raise_value_error_naming_the_value(build, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        build()


def test_empty_profile_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no measurements"):
        Energy().select([])


def test_optimum_selector_is_abstract_and_subclassable() -> None:
    with pytest.raises(TypeError):
        OptimumSelector()  # type: ignore[abstract]

    class SecondHighest(OptimumSelector):
        def select(self, measurements: list[PowerLimitMeasurement]) -> int:
            return sorted(m.power_limit for m in measurements)[-2]

    ms = measurements([(300, 1.0, 1.0), (250, 1.0, 1.0), (200, 1.0, 1.0)])
    assert SecondHighest().select(ms) == 250


rows_strategy = st.lists(
    st.tuples(st.floats(1.0, 1e4, allow_nan=False), st.floats(0.01, 100.0, allow_nan=False)),
    min_size=1,
    max_size=12,
).map(lambda v: [(400 - 25 * i, e, t) for i, (e, t) in enumerate(v)])


@given(rows=rows_strategy, eta=st.floats(0.0, 1.0), world=st.integers(1, 8))
def test_zeus_cost_agrees_with_plain_python(
    rows: list[tuple[int, float, float]], eta: float, world: int
) -> None:
    assert ZeusCost(eta, world).select(measurements(rows)) == zeus_cost_choice(rows, eta, world)


@given(rows=rows_strategy, factor=st.floats(1.0, 3.0))
def test_max_slowdown_agrees_with_plain_python(
    rows: list[tuple[int, float, float]], factor: float
) -> None:
    assert MaxSlowdownConstraint(factor).select(measurements(rows)) == slowdown_choice(rows, factor)
