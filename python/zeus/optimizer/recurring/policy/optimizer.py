"""The Zeus (NSDI'23) batch-size and power-limit policies, with the reference's interface.

Their decisions come from `zeus._core` (`crates/zeus-core/src/optimizer/recurring/`), which
the batch-size optimizer server and the trace simulator use too: `PruningGTSBatchSizeOptimizer`
keeps one `zeus._core.recurring.PruningGts` per job and `JITPowerLimitOptimizer` one
`zeus._core.recurring.JitPowerLimit`; the reference's attributes (`mabs`, `exp_manager`,
`best_pl`, ...) are read from them.
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
    return _core.recurring.reward_precision([float(r) for r in rewards])


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
        self._policy = _core.recurring.PruningGtsPolicy(
            self.batch_sizes, default, pruning_rounds=num_pruning_rounds
        )
        # (dispatched, converged, cost) of each exploration, per batch size, oldest first.
        self._explorations: dict[int, list[tuple[bool, bool, float]]] = defaultdict(list)
        self._survivors: list[int] = []
        # 0 means "nothing to explore" (the reference's convention).
        self.expecting = 0
        self._advance()

    def _advance(self) -> None:
        try:
            kind, value = self._policy.next_exploration(dict(self._explorations))
        except _core.recurring.NoConvergedBatchSizeError:
            # A round without survivors ends exploration with none (the reference's behaviour).
            kind, value = "done", []
        self.expecting = value if kind == "explore" else 0
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

    Each job's decisions are made by a `zeus._core.recurring.PruningGts` (two pruning rounds, then a
    bandit that pulls each survivor twice before sampling, each arm fitted on its last
    `window_size` rewards), the composition the trace simulator and the batch-size optimizer
    server decide through too.

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
        self.history: dict[Job, list[tuple[int, float]]] = {}
        self._jobs: dict[Job, _core.recurring.PruningGts] = {}

    @property
    def name(self) -> str:
        """Name of the policy."""
        return "Pruning GaussianTS BSO"

    @property
    def mabs(self) -> dict[Job, GaussianTS]:
        """The bandit of each job past pruning, as a `GaussianTS` snapshot (read-only)."""
        out = {}
        for job, core in self._jobs.items():
            arms = core.arms
            if arms is None:
                continue
            ts = GaussianTS(
                arms=[a.batch_size for a in arms],
                reward_precision=[a.reward_precision for a in arms],
                prior_mean=self.prior_mean,
                prior_precision=self.prior_precision,
                num_exploration=2,
                seed=self.seed,
                verbose=False,
            )
            ts.rng = core.rng
            for a in arms:
                ts.arm_param_mean[a.batch_size] = a.param_mean
                ts.arm_param_prec[a.batch_size] = a.param_precision
                ts.arm_num_observations[a.batch_size] = a.num_observations
            out[job] = ts
        return out

    @property
    def exp_manager(self) -> dict[Job, PruningExploreManager]:
        """Pruning exploration of each job, as a `PruningExploreManager` snapshot (read-only)."""
        out = {}
        for job, core in self._jobs.items():
            manager = PruningExploreManager(core.batch_sizes, core.default_batch_size)
            manager._explorations.update(core.explorations)
            manager._advance()
            out[job] = manager
        return out

    def register_job(self, job: Job, batch_sizes: list[int]) -> None:
        """Start pruning exploration for `job` from its default batch size."""
        if job.default_bs is None:
            raise ValueError(f"Default BS not specified for {job}.")
        if not batch_sizes:
            raise ValueError(f"Batch size list for {job} is empty.")
        policy = _core.recurring.PruningGtsPolicy(
            sorted(batch_sizes),
            job.default_bs,
            prior_mean=self.prior_mean,
            prior_precision=self.prior_precision,
            window_size=self.window_size,
        )
        self._jobs[job] = _core.recurring.PruningGts(policy, self.concurrency, self.seed)
        self.history[job] = []
        if self.verbose:
            self._log(f"Registered {job}")

    def _job(self, job: Job) -> _core.recurring.PruningGts:
        if job not in self._jobs:
            raise ValueError(f"{job} is not registered")
        return self._jobs[job]

    def predict(self, job: Job) -> int:
        """Next batch size: from pruning while it lasts, then from the bandit.

        Raises:
            ValueError: `job` is not registered, or pruning left no batch size
                (`zeus._core.recurring.NoConvergedBatchSizeError`).

        """
        core = self._job(job)
        bs = core.predict()
        if self.verbose:
            stage = "Thompson Sampling" if core.in_bandit_stage else "pruning"
            self._log(f"{job} in {stage} stage -> BS = {bs}")
        return bs

    def observe(
        self, job: Job, batch_size: int, cost: float, converged: bool | None = None
    ) -> None:
        """Learn the cost of a run.

        Raises:
            ValueError: `job` is not registered, `converged` is missing during pruning, or
                the bandit has no arm for `batch_size`.
            RuntimeError: (without `concurrency`) `batch_size` is not the one being explored.

        """
        core = self._job(job)
        self.history[job].append((batch_size, -cost))
        core.observe(batch_size, cost, converged)


class JITPowerLimitOptimizer(PowerLimitOptimizer):
    """Just-in-time power-limit optimizer: keep the cheapest profiled power limit per batch size.

    On equal cost the first observed power limit is kept. Each job's choice is a
    `zeus._core.recurring.JitPowerLimit`.
    """

    def __init__(self, verbose: bool = True) -> None:
        self.verbose = verbose
        self.observe_count: defaultdict[Job, defaultdict[int, int]] = defaultdict(
            lambda: defaultdict(int)
        )
        self._jobs: defaultdict[Job, _core.recurring.JitPowerLimit] = defaultdict(
            _core.recurring.JitPowerLimit
        )

    @property
    def name(self) -> str:
        """Name of the policy."""
        return "JITPSO"

    @property
    def best_pl(self) -> dict[Job, dict[int, int]]:
        """The best power limit of each profiled batch size, per job."""
        return {job: {bs: pl for bs, (pl, _) in c.best.items()} for job, c in self._jobs.items()}

    @property
    def best_cost(self) -> dict[Job, dict[int, float]]:
        """The cost of that power limit, per job and batch size."""
        return {
            job: {bs: c for bs, (_, c) in core.best.items()} for job, core in self._jobs.items()
        }

    def predict(self, job: Job, batch_size: int) -> int | None:
        """The best known power limit, or None if `batch_size` was never profiled."""
        pl = self._jobs[job].predict(batch_size)
        if self.verbose:
            self._log(f"{job} @ {batch_size} -> PL = {'needs profiling' if pl is None else pl}")
        return pl

    def observe(self, job: Job, batch_size: int, power_limit: int, cost: float) -> None:
        """Record the epoch cost of `power_limit`."""
        self.observe_count[job][batch_size] += 1
        self._jobs[job].observe(batch_size, power_limit, cost)
