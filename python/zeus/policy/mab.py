"""Gaussian Thompson sampling, the bandit behind Zeus's batch-size optimizer."""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

__all__ = ["GaussianTS"]


class GaussianTS:
    """Thompson sampling for Gaussian rewards with known precision and a Gaussian prior.

    The random draws follow the reference implementation exactly (numpy `default_rng(seed)`;
    every `predict` first draws a permutation of the arms, even after exploration, then one
    normal sample per arm in arm order), so the same seed and observations give the same
    choices as the reference.

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
        self.rng = np.random.default_rng(seed)
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

    def fit_arm(self, arm: int, rewards: np.ndarray, reset: bool) -> None:
        """Conjugate update of one arm's belief.

        Args:
            arm: The arm.
            rewards: Its new rewards.
            reset: Start from the prior (then `rewards` should be all of the arm's rewards).

        """
        if arm not in self.arm_param_mean:
            raise ValueError(f"Unknown arm {arm}; arms are {self.arms}")
        rewards = np.asarray(rewards, dtype=float)
        if reset:
            self.arm_param_mean[arm] = self.prior_mean
            self.arm_param_prec[arm] = self.prior_prec
            self.arm_num_observations[arm] = 0
        if rewards.size == 0:
            return
        reward_prec = self.arm_reward_prec[arm]
        if reward_prec == np.inf:
            # Noise-free rewards pin the mean down exactly.
            self.arm_param_prec[arm] = np.inf
            self.arm_param_mean[arm] = rewards.mean()
        else:
            prec = self.arm_param_prec[arm]
            new_prec = prec + rewards.size * reward_prec
            self.arm_param_mean[arm] = (
                prec * self.arm_param_mean[arm] + reward_prec * rewards.sum()
            ) / new_prec
            self.arm_param_prec[arm] = new_prec
        self.arm_num_observations[arm] += rewards.size

    def predict(self) -> int:
        """The arm to pull: an unexplored one if any, else the best sampled mean."""
        # The permutation is drawn on every call (the reference does so); it keeps the random
        # stream in step with the reference after exploration ends.
        for arm in self.rng.choice(np.array(self.arms), len(self.arms), replace=False):
            if self.arm_num_observations[int(arm)] < self.num_exploration:
                if self.verbose:
                    print(f"[{self.name}] Explore arm {arm}.")
                return int(arm)
        samples = self.predict_expectations()
        if self.verbose:
            print(f"[{self.name}] Sampled mean rewards:")
            for arm, sample in samples.items():
                print(
                    f"[{self.name}] Arm {arm:4d}: mu ~ N({self.arm_param_mean[arm]:.2f}, "
                    f"{1 / self.arm_param_prec[arm]:.2f}) -> {sample:.2f}"
                )
        return max(samples, key=samples.__getitem__)

    def predict_expectations(self) -> dict[int, float]:
        """One sample of each arm's expected reward, in arm order."""
        out: dict[int, float] = {}
        for arm in self.arms:
            prec = self.arm_param_prec[arm]
            if prec == self.prior_prec:
                warnings.warn(
                    f"predict_expectations called when arm '{arm}' is cold.", stacklevel=2
                )
            with np.errstate(divide="ignore"):
                scale = np.sqrt(np.reciprocal(float(prec)))
            out[arm] = float(self.rng.normal(self.arm_param_mean[arm], scale))
        return out
