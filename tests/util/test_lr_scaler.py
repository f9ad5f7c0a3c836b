"""zeus.util.lr_scaler."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from zeus.util.lr_scaler import LinearScaler, SquareRootScaler


def test_values() -> None:
    assert SquareRootScaler(bs=64, lr=0.1).compute_lr(256) == pytest.approx(0.2)
    assert LinearScaler(bs=64, lr=0.1).compute_lr(256) == pytest.approx(0.4)
    assert LinearScaler(bs=64, lr=0.1).compute_lr(16) == pytest.approx(0.025)


@given(bs=st.integers(1, 4096), lr=st.floats(1e-6, 10.0), new=st.integers(1, 4096))
def test_rules_hold(bs: int, lr: float, new: int) -> None:
    assert SquareRootScaler(bs, lr).compute_lr(new) == pytest.approx(lr * math.sqrt(new / bs))
    assert LinearScaler(bs, lr).compute_lr(new) == pytest.approx(lr * new / bs)
    # Same batch size, same learning rate.
    assert LinearScaler(bs, lr).compute_lr(bs) == pytest.approx(lr)


@pytest.mark.parametrize("cls", [SquareRootScaler, LinearScaler])
def test_bad_input_is_named(cls: type) -> None:
    with pytest.raises(ValueError, match="bs.*0"):
        cls(0, 0.1)
    with pytest.raises(ValueError, match="lr.*-1"):
        cls(32, -1.0)
    with pytest.raises(ValueError, match="new_bs.*-4"):
        cls(32, 0.1).compute_lr(-4)
