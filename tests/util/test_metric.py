"""zeus.util.metric: the cost and the threshold error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from zeus.util.metric import ZeusCostThresholdExceededError, zeus_cost


@given(e=st.floats(0, 1e6), t=st.floats(0, 1e5), eta=st.floats(0, 1), p=st.integers(1, 10_000))
def test_zeus_cost_formula(e: float, t: float, eta: float, p: int) -> None:
    assert zeus_cost(e, t, eta, p) == pytest.approx(eta * e + (1 - eta) * p * t)


def test_threshold_error() -> None:
    err = ZeusCostThresholdExceededError(10.0, 2000.0, 1500.0, 2100.0, 2000.0)
    assert type(err).__mro__[1] is Exception  # a plain Exception, as in the reference
    assert str(err).startswith("Next expected cost 2100.00 exceeds cost threshold 2000.00!")
    assert "reached=false" in str(err)
    assert (err.time_consumed, err.energy_consumed, err.cost, err.next_cost, err.cost_thresh) == (
        10.0,
        2000.0,
        1500.0,
        2100.0,
        2000.0,
    )
