"""Learning-rate scaling rules for a changed batch size."""

from __future__ import annotations

import math

__all__ = ["LinearScaler", "SquareRootScaler"]


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return value


class _Scaler:
    """A reference batch size and learning rate; subclasses say how the rate scales."""

    def __init__(self, bs: int, lr: float) -> None:
        """Remember the reference batch size and learning rate.

        Raises:
            ValueError: `bs` or `lr` is not positive.

        """
        self.bs = _check_positive("bs", bs)
        self.lr = _check_positive("lr", lr)


class SquareRootScaler(_Scaler):
    """`lr * sqrt(new_bs / bs)` (Krizhevsky, "One weird trick", 2014)."""

    def compute_lr(self, new_bs: int) -> float:
        """Return the learning rate for batch size `new_bs`."""
        return self.lr * math.sqrt(_check_positive("new_bs", new_bs) / self.bs)


class LinearScaler(_Scaler):
    """`lr * new_bs / bs` (Goyal et al., "Accurate, large minibatch SGD", 2017)."""

    def compute_lr(self, new_bs: int) -> float:
        """Return the learning rate for batch size `new_bs`."""
        return self.lr * _check_positive("new_bs", new_bs) / self.bs
