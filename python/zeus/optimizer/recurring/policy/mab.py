"""Gaussian Thompson sampling, the bandit behind Zeus's batch-size optimizer.

The arithmetic and the draws are `zeus._core`'s (`crates/zeus-core/src/optimizer/recurring/`),
shared with the batch-size optimizer server and the trace simulator; this class keeps the
reference's interface and per-arm attributes.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
from zeus import _core

__all__ = ["GaussianTS"]


class GaussianTS:
    """Thompson sampling for Gaussian rewards with known precision and a Gaussian prior.

    The random draws follow the reference implementation exactly (`zeus._core.recurring.NumpyRng` is
    numpy's `default_rng(seed)` draw for draw; every `predict` first draws a permutation of
    the arms, even after exploration, then one normal sample per arm in arm order), so the
    same seed and observations give the same choices as the reference.

    Args:
        arms: Arm values (batch sizes).
        reward_precision: Precision of one reward, for all arms or per arm (same order as
            `arms`).
        prior_mean: Prior mean of each arm's expected reward.
        prior_precision: Prior precision (0 is an uninformative prior).
        num_exploration: Pulls of each arm before sampling starts.
        seed: Seed of the generator.
        verbose: Print what is going on.

    Raises:
        ValueError: no arms, duplicate arms, or a per-arm precision list of the wrong length.

    """

    def __init__(
        self,
        arms: list[int],
        reward_precision: list[float] | float,
        prior_mean: float = 0.0,
        prior_precision: float = 0.0,
        num_exploration: int = 1,
        seed: int = 123456,
        verbose: bool = True,
    ) -> None:
        if len(arms) == 0:
            raise ValueError("GaussianTS needs at least one arm")
        if len(set(arms)) != len(arms):
            raise ValueError(f"GaussianTS arms must be distinct, got {arms}")
        self.name = "GaussianTS"
        self.arms = list(arms)
        self.prior_mean = prior_mean
        self.prior_prec = prior_precision
        self.num_exploration = num_exploration
        self.seed = seed
        self.rng = _core.recurring.NumpyRng(seed)
        self.verbose = verbose
        if isinstance(reward_precision, (list, tuple)):
            if len(reward_precision) != len(arms):
                raise ValueError(f"{len(reward_precision)} reward precisions for {len(arms)} arms")
            self.arm_reward_prec = dict(zip(self.arms, reward_precision))
        else:
            self.arm_reward_prec = {a: reward_precision for a in self.arms}
        self.arm_param_mean = {a: prior_mean for a in self.arms}
        self.arm_param_prec = {a: prior_precision for a in self.arms}
        self.arm_num_observations = {a: 0 for a in self.arms}

    def fit(
        self,
        decisions: Sequence[int] | np.ndarray,
        rewards: Sequence[float] | np.ndarray,
        reset: bool,
    ) -> None:
        """Fit every arm on the rewards observed when it was chosen.

        Args:
            decisions: Arm chosen at each step.
            rewards: Reward of each step.
            reset: Start every arm from the prior.

        """
        d = np.asarray(decisions)
        r = np.asarray(rewards, dtype=float)
        if d.shape != r.shape:
            raise ValueError(f"{d.size} decisions but {r.size} rewards")
        for arm in self.arms:
            self.fit_arm(arm, r[d == arm], reset)

    def _arm(self, arm: int) -> _core.recurring.Arm:
        return _core.recurring.Arm(
            arm,
            float(self.arm_param_mean[arm]),
            float(self.arm_param_prec[arm]),
            float(self.arm_reward_prec[arm]),
            self.arm_num_observations[arm],
        )

    def fit_arm(self, arm: int, rewards: np.ndarray, reset: bool) -> None:
        """Conjugate update of one arm's belief.

        Args:
            arm: The arm.
            rewards: Its new rewards.
            reset: Start from the prior (then `rewards` should be all of the arm's rewards).

        """
        if arm not in self.arm_param_mean:
            raise ValueError(f"Unknown arm {arm}; arms are {self.arms}")
        values = [float(r) for r in np.asarray(rewards, dtype=float).ravel()]
        fitted = _core.recurring.bandit_fit_arm(
            self._arm(arm), values, reset, float(self.prior_mean), float(self.prior_prec)
        )
        self.arm_param_mean[arm] = fitted.param_mean
        self.arm_param_prec[arm] = fitted.param_precision
        self.arm_num_observations[arm] = fitted.num_observations

    def predict(self) -> int:
        """The arm to pull: an unexplored one if any, else the best sampled mean."""
        arms = [self._arm(a) for a in self.arms]
        if self.verbose and all(a.num_observations >= self.num_exploration for a in arms):
            print(f"[{self.name}] Sampling mean rewards of arms {self.arms}.")
        choice = _core.recurring.thompson_predict(arms, self.num_exploration, self.rng)
        if self.verbose:
            print(f"[{self.name}] Arm {choice}.")
        return choice

    def predict_expectations(self) -> dict[int, float]:
        """One sample of each arm's expected reward, in arm order."""
        out: dict[int, float] = {}
        for arm in self.arms:
            prec = self.arm_param_prec[arm]
            if prec == self.prior_prec:
                warnings.warn(
                    f"predict_expectations called when arm '{arm}' is cold.", stacklevel=2
                )
            # Infinite precision gives scale 0; a cold arm (precision 0) an infinite one.
            scale = math.inf if prec == 0 else (1 / prec) ** 0.5
            out[arm] = self.rng.normal(float(self.arm_param_mean[arm]), scale)
        return out
