"""`zeus.monitor.periods`: what a window's slices charge (the slicing itself is tested through
`CarbonEmissionMonitor` in test_carbon.py, with periods a fraction of a second long)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from zeus.monitor.periods import PeriodWindows, charge


@given(
    energy=st.floats(0, 1e7),
    slices=st.lists(st.tuples(st.floats(0, 1e6), st.floats(0, 2000)), min_size=1, max_size=30),
)
def test_a_charge_stays_within_the_slices_rates(
    energy: float, slices: list[tuple[float, float]]
) -> None:
    energies, intensities = [e for e, _ in slices], [i for _, i in slices]
    g = charge(energy, energies, intensities)
    kwh = energy / 3.6e6
    assert min(intensities) * kwh * (1 - 1e-9) <= g <= max(intensities) * kwh * (1 + 1e-9)
    if len(set(intensities)) == 1:
        assert g == pytest.approx(kwh * intensities[0])


def test_a_charge_weighs_rates_by_slice_energy() -> None:
    # 3.6 MJ = 1 kWh; three quarters of it at 400 g/kWh, one quarter at 100 g/kWh.
    assert charge(3.6e6, [300.0, 100.0], [400.0, 100.0]) == pytest.approx(325.0)
    assert charge(3.6e6, [0.0, 0.0], [400.0, 100.0]) == pytest.approx(250.0)
    with pytest.raises(ValueError):
        charge(1.0, [1.0], [])


def test_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="period 0:00:00 is not positive"):
        PeriodWindows(timedelta(0), gpu_indices=[])
