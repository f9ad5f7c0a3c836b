"""The optimizer's decisions, as the server calls them.

The decisions themselves are `zeus._core`'s (`crates/zeus-core/src/optimizer/recurring/`), the
one implementation `zeus.policy` and the trace simulator use too: pruning exploration, Gaussian
Thompson sampling with numpy's generator reproduced draw for draw (its state stays numpy's
JSON, so stored jobs keep working), and the stop rule of a report. This module gives them the
server's types. The service feeds them rows read under the job's lock and writes their
results back in the same transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

from zeus import _core

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
    kind, value = _core.pruning_next_step(
        [int(b) for b in batch_sizes],
        int(default_batch_size),
        int(num_pruning_rounds),
        {
            int(bs): [(bool(e.dispatched), bool(e.converged), float(e.cost)) for e in done]
            for bs, done in explorations.items()
        },
    )
    if kind == "explore":
        return ExploreNext(value)
    if kind == "wait":
        return WaitForExploration()
    if kind == "done":
        return PruningDone(list(value))
    raise NoConvergedBatchSizeError(value)


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
    values = [float(r) for r in rewards]
    prior = (
        int(batch_size),
        float(prior_mean),
        float(prior_precision),
        _core.reward_precision(values),
        0,
    )
    return ArmState(
        *_core.bandit_fit_arm(prior, values, True, float(prior_mean), float(prior_precision))
    )


def new_rng_state(seed: int | None) -> str:
    """Numpy's JSON state of a fresh `default_rng(seed)` (from the OS when `seed` is None)."""
    return _core.NumpyRng(seed).state


def load_rng(state: str) -> _core.NumpyRng:
    """The generator in the state numpy's JSON describes."""
    return _core.NumpyRng.from_state(state)


def dump_rng(rng: _core.NumpyRng) -> str:
    """The generator's state as numpy's JSON."""
    return rng.state


def thompson_predict(arms: Sequence[ArmState], num_explorations: int, rng: _core.NumpyRng) -> int:
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
    return _core.thompson_predict(
        [
            (
                int(a.batch_size),
                float(a.param_mean),
                float(a.param_precision),
                float(a.reward_precision),
                int(a.num_observations),
            )
            for a in arms
        ],
        int(num_explorations),
        rng,
    )


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
    # Database rows give SQLite's integers for booleans, and may give ints for floats.
    stop, converged, message = _core.decide_report(
        batch_size=int(batch_size),
        cost=float(cost),
        metric=float(metric),
        current_epoch=int(current_epoch),
        target_metric=float(target_metric),
        higher_is_better=bool(higher_is_better),
        max_epochs=int(max_epochs),
        beta_knob=None if beta_knob is None else float(beta_knob),
        min_cost=None if min_cost is None else float(min_cost),
    )
    return ReportDecision(stop, converged, message, cost)
