"""`zeus.util.indices.check_indices`: the one device-index check of ZeusMonitor, zeus.metric
and the power-streaming configurations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from zeus.util.indices import check_indices


@given(st.lists(st.integers(min_value=0, max_value=1 << 20), unique=True))
def test_distinct_indices_pass_unchanged(indices: list[int]) -> None:
    assert check_indices("gpu_indices", indices) == indices
    assert check_indices("gpu_indices", tuple(indices)) == indices


@given(st.lists(st.integers(min_value=0, max_value=64), min_size=1), st.data())
def test_any_repeat_is_named(indices: list[int], data: st.DataObject) -> None:
    repeated = data.draw(st.sampled_from(indices))
    with pytest.raises(ValueError, match=f"device {repeated} appears twice|appears twice"):
        check_indices("cpu_indices", [*indices, repeated])


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("01", r"cpu_indices='01': expected a list of device indices, not a string"),
        (3, "cpu_indices=3: expected a list of device indices"),
        ([0, -2], r"cpu_indices=\[0, -2\]: -2 is not a device index"),
        ([True], "True is not a device index"),
        ([1.0], "1.0 is not a device index"),
    ],
)
def test_bad_values_are_named(value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_indices("cpu_indices", value)  # type: ignore[arg-type]


def test_none_means_the_default() -> None:
    assert check_indices("gpu_indices", None) is None
