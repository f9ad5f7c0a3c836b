"""The interfaces that batch-size and power-limit policies implement."""

from __future__ import annotations

from abc import ABC, abstractmethod

from zeus.optimizer.recurring.job import Job

__all__ = ["BatchSizeOptimizer", "PowerLimitOptimizer"]


class BatchSizeOptimizer(ABC):
    """Chooses the batch size of each run of a recurring job and learns from its cost."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Name of the policy, used in log lines."""

    @abstractmethod
    def register_job(self, job: Job, batch_sizes: list[int]) -> None:
        """Prepare to optimize `job` over the feasible `batch_sizes`."""

    @abstractmethod
    def predict(self, job: Job) -> int:
        """The batch size of the next run of `job`."""

    @abstractmethod
    def observe(
        self, job: Job, batch_size: int, cost: float, converged: bool | None = None
    ) -> None:
        """Learn that running `job` at `batch_size` cost `cost` and did (not) converge."""

    def _log(self, message: str) -> None:
        print(f"[{self.name}] {message}")


class PowerLimitOptimizer(ABC):
    """Chooses the GPU power limit of each run of a recurring job."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Name of the policy, used in log lines."""

    @abstractmethod
    def predict(self, job: Job, batch_size: int) -> int | None:
        """The power limit (W) for `job` at `batch_size`, or None when it needs profiling."""

    @abstractmethod
    def observe(self, job: Job, batch_size: int, power_limit: int, cost: float) -> None:
        """Learn the epoch cost of `job` at `batch_size` and `power_limit`."""

    def _log(self, message: str) -> None:
        print(f"[{self.name}] {message}")
