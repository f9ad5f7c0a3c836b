"""The Zeus (NSDI'23) batch-size and power-limit policies, with the reference's interface.

Their decisions come from `zeus._core` (`crates/zeus-core/src/optimizer/recurring/`), which
the batch-size optimizer server and the trace simulator use too.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from zeus import _core
from zeus.optimizer.recurring.job import Job
from zeus.optimizer.recurring.policy.interface import BatchSizeOptimizer, PowerLimitOptimizer
from zeus.optimizer.recurring.policy.mab import GaussianTS

__all__ = [
    "GTSBatchSizeOptimizer",
    "PruningExploreManager",
    "PruningGTSBatchSizeOptimizer",
    "JITPowerLimitOptimizer",
]


def _precision(rewards: np.ndarray) -> float:
    """1 / variance of `rewards`, infinite when they are all equal."""
    return _core.reward_precision([float(r) for r in rewards])


class GTSBatchSizeOptimizer(BatchSizeOptimizer):
    """One Gaussian Thompson-sampling bandit per job over all its batch sizes.

    Args:
        learn_reward_precision: Estimate each arm's reward precision from its observations
            (and refit from the prior each time) instead of using `reward_precision`.
        reward_precision: Fixed reward precision when not learning it.
        prior_mean: See `GaussianTS`.
        prior_precision: See `GaussianTS`.
        num_exploration: See `GaussianTS`.
        seed: See `GaussianTS`.
        verbose: Print decisions.

    """

    def __init__(
        self,
        learn_reward_precision: bool,
        reward_precision: float = 0.0,
        prior_mean: float = 0.0,
        prior_precision: float = 0.0,
        num_exploration: int = 1,
        seed: int = 123456,
        verbose: bool = True,
    ) -> None:
        self.learn_reward_precision = learn_reward_precision
        self.reward_precision = reward_precision
        self.prior_mean = prior_mean
        self.prior_precision = prior_precision
        self.num_exploration = num_exploration
        self.seed = seed
        self.verbose = verbose
        self.mabs: dict[Job, GaussianTS] = {}
        self.batch_sizes: dict[Job, list[int]] = {}
        self.history: dict[Job, defaultdict[int, list[float]]] = {}

    @property
    def name(self) -> str:
        """Name of the policy."""
        return "GaussianTS BSO"

    def register_job(self, job: Job, batch_sizes: list[int]) -> None:
        """Create the bandit of `job` (once)."""
        if job in self.mabs:
            return
        if not batch_sizes:
            raise ValueError(f"Batch size list for {job} is empty.")
        self.mabs[job] = GaussianTS(
            arms=list(batch_sizes),
            reward_precision=self.reward_precision,
            prior_mean=self.prior_mean,
            prior_precision=self.prior_precision,
            num_exploration=self.num_exploration,
            seed=self.seed,
            verbose=self.verbose,
        )
        self.batch_sizes[job] = list(batch_sizes)
        self.history[job] = defaultdict(list)
        if self.verbose:
            self._log(f"Registered {job}")

    def predict(self, job: Job) -> int:
        """The bandit's choice for `job`."""
        if job not in self.mabs:
            raise ValueError(f"{job} is not registered")
        bs = self.mabs[job].predict()
        if self.verbose:
            self._log(f"{job} -> BS = {bs}")
        return bs

    def observe(
        self, job: Job, batch_size: int, cost: float, converged: bool | None = None
    ) -> None:
        """Reward the arm with `-cost`."""
        if job not in self.mabs:
            raise ValueError(f"{job} is not registered")
        if batch_size not in self.batch_sizes[job]:
            raise ValueError(f"Unknown batch size '{batch_size}' for {job}.")
        reward = -cost
        self.history[job][batch_size].append(reward)
        mab = self.mabs[job]
        if not self.learn_reward_precision:
            mab.fit([batch_size], [reward], reset=False)
            return
        rewards = np.array(self.history[job][batch_size])
        mab.arm_reward_prec[batch_size] = _precision(rewards)
        mab.fit_arm(batch_size, rewards, reset=True)


class PruningExploreManager:
    """Pruning exploration of the batch-size space.

    Each round walks down from the default batch size (default first), then up from the one
    above it; a run that misses the target ends that direction. Batch sizes that reached the
    target survive, and the cheapest becomes the next round's default.

    Call `next_batch_size()`, run it, then `report_batch_size_result(...)` with the same batch
    size. When exploration is over `next_batch_size` raises `StopIteration` whose `value` is the
    sorted surviving batch sizes.

    Args:
        batch_sizes: Batch sizes to prune (ascending).
        default: The batch size to start from.
        num_pruning_rounds: Number of rounds.

    Raises:
        ValueError: `default` is not in `batch_sizes`.

    """

    def __init__(self, batch_sizes: list[int], default: int, num_pruning_rounds: int = 2) -> None:
        if default not in batch_sizes:
            raise ValueError(f"Default batch size {default} not in {batch_sizes}.")
        self.batch_sizes = sorted(batch_sizes)
        self.default = default
        self.num_pruning_rounds = num_pruning_rounds
        # (dispatched, converged, cost) of each exploration, per batch size, oldest first.
        self._explorations: dict[int, list[tuple[bool, bool, float]]] = defaultdict(list)
        self._survivors: list[int] = []
        # 0 means "nothing to explore" (the reference's convention).
        self.expecting = 0
        self._advance()

    def _advance(self) -> None:
        kind, value = _core.pruning_next_step(
            self.batch_sizes, self.default, self.num_pruning_rounds, dict(self._explorations)
        )
        self.expecting = value if kind == "explore" else 0
        # A round without survivors ends exploration with none (the reference's behaviour).
        self._survivors = list(value) if kind == "done" else []

    def next_batch_size(self) -> int:
        """The batch size to explore next.

        Raises:
            StopIteration: exploration is over; `.value` holds the surviving batch sizes.

        """
        if self.expecting == 0:
            raise StopIteration(sorted(self._survivors))
        return self.expecting

    def report_batch_size_result(self, batch_size: int, cost: float, reached: bool) -> None:
        """Report the result of the batch size `next_batch_size` returned.

        Raises:
            RuntimeError: `batch_size` is not the one being explored.

        """
        if self.expecting == 0 or batch_size != self.expecting:
            raise RuntimeError(
                f"PruningExploreManager: self.expecting={self.expecting}, {batch_size=}"
            )
        self._explorations[batch_size].append((False, bool(reached), float(cost)))
        self._advance()


class PruningGTSBatchSizeOptimizer(BatchSizeOptimizer):
    """The Zeus batch-size optimizer: pruning exploration, then Gaussian Thompson sampling.

    Args:
        prior_mean: See `GaussianTS`.
        prior_precision: See `GaussianTS`.
        window_size: Rewards of each batch size the bandit looks at (most recent first);
            0 means all of them.
        concurrency: Allow observations of batch sizes other than the one being explored
            (concurrent submissions); such observations are not reported to pruning.
        seed: Seed of the bandit.
        verbose: Print decisions.

    """

    def __init__(
        self,
        prior_mean: float = 0.0,
        prior_precision: float = 0.0,
        window_size: int = 0,
        concurrency: bool = False,
        seed: int = 123456,
        verbose: bool = True,
    ) -> None:
        self.prior_mean = prior_mean
        self.prior_precision = prior_precision
        self.window_size = window_size
        self.concurrency = concurrency
        self.seed = seed
        self.verbose = verbose
        self.mabs: dict[Job, GaussianTS] = {}
        self.exp_manager: dict[Job, PruningExploreManager] = {}
        self.history: dict[Job, list[tuple[int, float]]] = {}

    @property
    def name(self) -> str:
        """Name of the policy."""
        return "Pruning GaussianTS BSO"

    def register_job(self, job: Job, batch_sizes: list[int]) -> None:
        """Start pruning exploration for `job` from its default batch size."""
        if job.default_bs is None:
            raise ValueError(f"Default BS not specified for {job}.")
        if not batch_sizes:
            raise ValueError(f"Batch size list for {job} is empty.")
        self.exp_manager[job] = PruningExploreManager(sorted(batch_sizes), job.default_bs)
        self.history[job] = []
        if self.verbose:
            self._log(f"Registered {job}")

    def predict(self, job: Job) -> int:
        """Next batch size: from pruning while it lasts, then from the bandit."""
        if job not in self.exp_manager:
            raise ValueError(f"{job} is not registered")
        try:
            bs = self.exp_manager[job].next_batch_size()
            stage = "pruning"
        except StopIteration as stop:
            if job not in self.mabs:
                self._construct_mab(job, list(stop.value))
            bs = self.mabs[job].predict()
            stage = "Thompson Sampling"
        if self.verbose:
            self._log(f"{job} in {stage} stage -> BS = {bs}")
        return bs

    def observe(
        self, job: Job, batch_size: int, cost: float, converged: bool | None = None
    ) -> None:
        """Learn the cost of a run."""
        if job not in self.exp_manager:
            raise ValueError(f"{job} is not registered")
        self.history[job].append((batch_size, -cost))
        if job in self.mabs:
            rewards = np.array(self._get_history_for_bs(job, batch_size))
            mab = self.mabs[job]
            mab.arm_reward_prec[batch_size] = _precision(rewards)
            mab.fit_arm(batch_size, rewards, reset=True)
            return
        if converged is None:
            raise ValueError("observe needs `converged` during pruning exploration")
        manager = self.exp_manager[job]
        if self.concurrency and manager.expecting != batch_size:
            return
        manager.report_batch_size_result(batch_size, cost, converged)

    def _get_history_for_bs(self, job: Job, batch_size: int) -> list[float]:
        """The last `window_size` rewards of `batch_size` (all if 0), oldest first."""
        rewards = [r for bs, r in self.history[job] if bs == batch_size]
        if self.window_size > 0:
            rewards = rewards[-self.window_size :]
        return rewards

    def _construct_mab(self, job: Job, batch_sizes: list[int]) -> None:
        if not batch_sizes:
            raise ValueError(
                "Empty batch size set when constructing MAB. "
                "Probably all batch sizes have been pruned."
            )
        mab = GaussianTS(
            arms=batch_sizes,
            reward_precision=0.0,
            prior_mean=self.prior_mean,
            prior_precision=self.prior_precision,
            num_exploration=2,
            seed=self.seed,
            verbose=self.verbose,
        )
        for bs in batch_sizes:
            rewards = np.array(self._get_history_for_bs(job, bs))
            if rewards.size < 2:
                raise RuntimeError(f"Number of observations for {bs} is {rewards.size}.")
            mab.arm_reward_prec[bs] = _precision(rewards)
            mab.fit_arm(bs, rewards, reset=True)
        self.mabs[job] = mab


class JITPowerLimitOptimizer(PowerLimitOptimizer):
    """Just-in-time power-limit optimizer: keep the cheapest profiled power limit per batch size.

    On equal cost the first observed power limit is kept.
    """

    def __init__(self, verbose: bool = True) -> None:
        self.verbose = verbose
        self.best_pl: defaultdict[Job, dict[int, int]] = defaultdict(dict)
        self.best_cost: defaultdict[Job, dict[int, float]] = defaultdict(dict)
        self.observe_count: defaultdict[Job, defaultdict[int, int]] = defaultdict(
            lambda: defaultdict(int)
        )

    @property
    def name(self) -> str:
        """Name of the policy."""
        return "JITPSO"

    def predict(self, job: Job, batch_size: int) -> int | None:
        """The best known power limit, or None if `batch_size` was never profiled."""
        pl = self.best_pl[job].get(batch_size)
        if self.verbose:
            self._log(f"{job} @ {batch_size} -> PL = {'needs profiling' if pl is None else pl}")
        return pl

    def observe(self, job: Job, batch_size: int, power_limit: int, cost: float) -> None:
        """Record the epoch cost of `power_limit`."""
        self.observe_count[job][batch_size] += 1
        prev = self.best_cost[job].get(batch_size)
        if prev is None or prev > cost:
            self.best_pl[job][batch_size] = power_limit
            self.best_cost[job][batch_size] = cost
