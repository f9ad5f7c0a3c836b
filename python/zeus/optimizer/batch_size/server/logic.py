"""The optimizer's decisions as pure functions.

Pruning explorer, Gaussian Thompson sampling, and the stop rule of a report. The service feeds
them rows read under the job's lock and writes their results back in the same transaction.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import numpy as np

logger = logging.getLogger("zeus.optimizer.batch_size.server.mab")


# ---------------------------------------------------------------------------------------------
# Pruning explorer


@dataclass(frozen=True)
class Exploration:
    """One non-failed exploration trial of a batch size.

    Attributes:
        dispatched: The trial has not ended yet.
        converged: It reached the target within the cost bound (meaningless while dispatched).
        cost: Its Zeus cost (meaningless while dispatched).

    """

    dispatched: bool
    converged: bool
    cost: float


@dataclass(frozen=True)
class ExploreNext:
    """Explore `batch_size` next (a new Exploration trial)."""

    batch_size: int


@dataclass(frozen=True)
class WaitForExploration:
    """An exploration is in flight: a concurrent recurrence runs the best batch size so far."""


@dataclass(frozen=True)
class PruningDone:
    """Pruning is over; `batch_sizes` (sorted) survived and become the bandit's arms."""

    batch_sizes: list[int]


ExploreStep = Union[ExploreNext, WaitForExploration, PruningDone]


class NoConvergedBatchSizeError(Exception):
    """A pruning round ended without any batch size that converged."""


def next_exploration(
    batch_sizes: Sequence[int],
    default_batch_size: int,
    num_pruning_rounds: int,
    explorations: Mapping[int, Sequence[Exploration]],
) -> ExploreStep:
    """Replay pruning exploration over the recorded explorations and say what comes next.

    Each round explores from the current default downwards (default first), breaking at the
    first batch size that does not converge, then upwards from just above the default, also
    breaking at the first failure. The converged batch sizes form the next round's candidates
    and the cheapest of them (first one on ties) its default. A round's `r`-th exploration of a
    batch size is `explorations[bs][r]`, so the function is stateless: it recomputes the
    position from the database on every call.

    Args:
        batch_sizes: All candidate batch sizes, sorted.
        default_batch_size: The job's default (first) batch size.
        num_pruning_rounds: Number of rounds.
        explorations: Non-failed exploration trials per batch size, oldest first.

    Raises:
        NoConvergedBatchSizeError: a round ended with no converged batch size.

    """
    candidates = sorted(batch_sizes)
    default = default_batch_size
    for rnd in range(num_pruning_rounds):
        idx = candidates.index(default)
        down = candidates[: idx + 1][::-1]
        up = candidates[idx + 1 :]
        good: list[int] = []
        best_cost = math.inf
        best_bs = default
        for direction in (down, up):
            for bs in direction:
                done = explorations.get(bs, ())
                if len(done) <= rnd:
                    return ExploreNext(bs)
                exp = done[rnd]
                if exp.dispatched:
                    return WaitForExploration()
                if not exp.converged:
                    break
                good.append(bs)
                if exp.cost < best_cost:
                    best_cost = exp.cost
                    best_bs = bs
        if not good:
            raise NoConvergedBatchSizeError(
                f"No batch size converged in pruning round {rnd + 1}; "
                "relax target_metric, max_epochs or beta_knob and register a new job"
            )
        candidates = sorted(good)
        default = best_bs
    return PruningDone(candidates)


# ---------------------------------------------------------------------------------------------
# Gaussian Thompson sampling


@dataclass(frozen=True)
class ArmState:
    """Posterior of one arm's expected reward (reward = -cost).

    Attributes:
        batch_size: The arm.
        param_mean: Posterior mean.
        param_precision: Posterior precision (inf when all rewards were equal).
        reward_precision: Precision of the rewards, 1/var (inf when var is 0).
        num_observations: Rewards the posterior is fitted on.

    """

    batch_size: int
    param_mean: float
    param_precision: float
    reward_precision: float
    num_observations: int


def fit_arm(
    batch_size: int, prior_mean: float, prior_precision: float, rewards: Sequence[float]
) -> ArmState:
    """Fit an arm's Gaussian posterior from the prior on `rewards` (conjugate update).

    The reward precision is learned as `1/var(rewards)`; with zero variance (e.g. a single
    reward) it is infinite and the posterior collapses onto the rewards' mean. With no rewards
    the arm keeps its prior.
    """
    if len(rewards) == 0:
        return ArmState(batch_size, float(prior_mean), float(prior_precision), 0.0, 0)
    r = np.asarray(rewards, dtype=np.float64)
    # Equal rewards have zero variance; np.var can return a rounding residue (e.g. 1e-32) instead.
    var = 0.0 if bool(np.all(r == r[0])) else float(np.var(r))
    if var == 0.0:
        return ArmState(batch_size, float(r.mean()), math.inf, math.inf, len(r))
    reward_prec = 1.0 / var
    prec = prior_precision + len(r) * reward_prec
    mean = (prior_precision * prior_mean + reward_prec * float(r.sum())) / prec
    return ArmState(batch_size, float(mean), float(prec), float(reward_prec), len(r))


def new_rng_state(seed: int | None) -> str:
    """JSON of a fresh PCG64 generator state (from the OS when `seed` is None)."""
    return json.dumps(np.random.default_rng(seed).bit_generator.state)


def load_rng(state: str) -> np.random.Generator:
    """Rebuild the numpy generator from its JSON state."""
    bit_gen = np.random.PCG64()
    bit_gen.state = json.loads(state)
    return np.random.Generator(bit_gen)


def dump_rng(rng: np.random.Generator) -> str:
    """JSON of the generator's state."""
    return json.dumps(rng.bit_generator.state)


def thompson_predict(
    arms: Sequence[ArmState], num_explorations: int, rng: np.random.Generator
) -> int:
    """Choose the next batch size.

    Arms are visited in a random permutation and the first one with fewer than
    `num_explorations` observations (or none at all) is explored. Otherwise each arm's expected
    reward is sampled from its posterior, in `arms` order, and the argmax (first on ties) wins.
    Like the reference, the permutation is drawn on every call, so seeded runs consume the
    generator identically to it.

    Args:
        arms: The bandit's arms, sorted by batch size.
        num_explorations: Pulls each arm gets before sampling.
        rng: The job's generator (advanced in place).

    """
    if not arms:
        raise ValueError("arms is empty")
    by_bs = {a.batch_size: a for a in arms}
    order = rng.choice([a.batch_size for a in arms], len(arms), replace=False)
    for bs in order:
        arm = by_bs[int(bs)]
        if arm.num_observations < num_explorations or arm.num_observations == 0:
            return int(bs)
    best_bs, best_sample = arms[0].batch_size, -math.inf
    for arm in arms:
        scale = 0.0 if math.isinf(arm.param_precision) else math.sqrt(1.0 / arm.param_precision)
        sample = float(rng.normal(arm.param_mean, scale))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "[GaussianTS] Arm %d: mu ~ N(%.2f, %.2f) -> %.2f",
                arm.batch_size,
                arm.param_mean,
                1.0 / arm.param_precision,
                sample,
            )
        if sample > best_sample:
            best_bs, best_sample = arm.batch_size, sample
    return best_bs


# ---------------------------------------------------------------------------------------------
# Report


@dataclass(frozen=True)
class ReportDecision:
    """What a report means for its trial.

    Attributes:
        stop: The trial ends now.
        converged: It ended having reached the target within the cost bound.
        message: Human-readable reason.
        cost: Zeus cost of the reported cumulative time and energy.

    """

    stop: bool
    converged: bool
    message: str
    cost: float


def decide_report(
    *,
    batch_size: int,
    cost: float,
    metric: float,
    current_epoch: int,
    target_metric: float,
    higher_is_better: bool,
    max_epochs: int,
    beta_knob: float | None,
    min_cost: float | None,
) -> ReportDecision:
    """Apply the stop rule to one report.

    The trial keeps training while its cumulative cost is within `beta * min_cost`, it has not
    converged and `current_epoch < max_epochs`. The early stop is reactive (on the cost so far),
    as in the reference server.
    """
    cost_ub = beta_knob * min_cost if (beta_knob is not None and min_cost is not None) else math.inf
    within = cost <= cost_ub
    reached = target_metric <= metric if higher_is_better else target_metric >= metric
    if within and current_epoch < max_epochs and not reached:
        return ReportDecision(False, False, "Stop condition not met, keep training", cost)
    if not within:
        message = (
            f"Batch Size({batch_size}) exceeded the cost upper bound: current cost({cost}) > "
            f"beta_knob({beta_knob})*min_cost({min_cost})"
        )
    elif reached:
        message = "Train succeeded"
    else:
        message = f"Train failed to converge within max_epoch({max_epochs})"
    return ReportDecision(True, reached and within, message, cost)
