"""The optimizer's decisions, as the server calls them.

The decisions themselves are `zeus._core`'s (`crates/zeus-core/src/optimizer/recurring/`), the
one implementation `zeus.policy` and the trace simulator use too: the batch-size policy
(`PruningGtsPolicy`: pruning exploration, then Gaussian Thompson sampling with numpy's
generator reproduced draw for draw; its state stays numpy's JSON, so stored jobs keep
working) and the stop rule of a report. This module builds a job's policy from its row and
gives the primitives beneath it the server's types. The service feeds the policy rows read
under the job's lock and writes its decisions back in the same transaction.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import Any

from zeus import _core

logger = logging.getLogger("zeus.optimizer.batch_size.server.mab")


#: A pruning round ended without any batch size that converged (a `ValueError`).
NoConvergedBatchSizeError = _core.recurring.NoConvergedBatchSizeError


def policy_of(job: Any) -> _core.recurring.PruningGtsPolicy:
    """The batch-size policy of a job row (its `window_size <= 0` means every reward)."""
    return _policy(
        job.batch_sizes,
        int(job.default_batch_size),
        int(job.num_pruning_rounds),
        float(job.mab_prior_mean),
        float(job.mab_prior_precision),
        int(job.mab_num_explorations),
        int(job.window_size),
    )


# A job's settings never change, and a policy is immutable: the one built for them serves
# every request of the job (parsing the batch sizes each time cost a few % of a cycle).
@functools.lru_cache(maxsize=1024)
def _policy(
    batch_sizes_json: str,
    default_batch_size: int,
    pruning_rounds: int,
    prior_mean: float,
    prior_precision: float,
    bandit_explorations: int,
    window_size: int,
) -> _core.recurring.PruningGtsPolicy:
    return _core.recurring.PruningGtsPolicy(
        json.loads(batch_sizes_json),
        default_batch_size,
        pruning_rounds=pruning_rounds,
        prior_mean=prior_mean,
        prior_precision=prior_precision,
        bandit_explorations=bandit_explorations,
        window_size=window_size,
    )


#: Posterior of one arm's expected reward (reward = -cost): `batch_size`, `param_mean`,
#: `param_precision` (inf when all rewards were equal), `reward_precision` (1/var of the
#: rewards, inf when it is 0) and `num_observations` (rewards the posterior is fitted on).
ArmState = _core.recurring.Arm


def new_rng_state(seed: int | None) -> str:
    """Numpy's JSON state of a fresh `default_rng(seed)` (from the OS when `seed` is None)."""
    return dump_rng(_core.recurring.NumpyRng(seed))


def load_rng(state: str) -> _core.recurring.NumpyRng:
    """The generator in the state numpy's JSON describes (`json.dumps(bit_generator.state)`).

    Raises:
        ValueError: not JSON, or a field numpy would refuse (the message names it).

    """
    try:
        fields = json.loads(state)
    except json.JSONDecodeError as e:
        raise ValueError(f"generator state is not valid JSON: {e}") from None
    return _core.recurring.NumpyRng.from_state(fields)


def dump_rng(rng: _core.recurring.NumpyRng) -> str:
    """The generator's state as numpy's JSON, byte for byte what numpy's would be."""
    return json.dumps(rng.state)


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
    stop, converged, message = _core.recurring.decide_report(
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
