# Hand-kept stubs of `zeus._core.recurring`: recurring jobs (src/python/recurring/).
# Keep in sync with the #[pymethods] / #[pyfunction] signatures.

import os
from collections.abc import Mapping
from typing import Any, Literal, Protocol, Self, TypeAlias, final

__all__ = [
    "SimTable",
    "NumpyRng",
    "Arm",
    "Decision",
    "PruningGtsPolicy",
    "PruningGts",
    "JitPowerLimit",
    "NoConvergedBatchSizeError",
    "reward_precision",
    "bandit_fit_arm",
    "thompson_predict",
    "decide_report",
]

_StrPath: TypeAlias = str | os.PathLike[str]

@final
class NumpyRng:
    def __new__(cls, seed: int | None = None) -> Self: ...
    @staticmethod
    def from_state(state: Mapping[str, Any]) -> NumpyRng: ...
    @property
    def state(self) -> dict[str, Any]: ...
    def permutation(self, n: int) -> list[int]: ...
    def normal(self, loc: float, scale: float) -> float: ...
    def choice_one(self, n: int) -> int: ...

class NoConvergedBatchSizeError(ValueError): ...

@final
class Arm:
    def __new__(
        cls,
        batch_size: int,
        param_mean: float,
        param_precision: float,
        reward_precision: float,
        num_observations: int,
    ) -> Self: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def param_mean(self) -> float: ...
    @property
    def param_precision(self) -> float: ...
    @property
    def reward_precision(self) -> float: ...
    @property
    def num_observations(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...

@final
class Decision:
    @property
    def batch_size(self) -> int: ...
    @property
    def kind(self) -> Literal["exploration", "concurrent", "bandit"]: ...
    @property
    def new_arms(self) -> list[Arm] | None: ...

# (dispatched, converged, cost) of one exploration trial
_Exploration: TypeAlias = tuple[bool, bool, float]

@final
class PruningGtsPolicy:
    def __new__(
        cls,
        batch_sizes: list[int],
        default_batch_size: int,
        pruning_rounds: int = 2,
        prior_mean: float = 0.0,
        prior_precision: float = 0.0,
        bandit_explorations: int = 2,
        window_size: int = 0,
    ) -> Self: ...
    @property
    def batch_sizes(self) -> list[int]: ...
    @property
    def default_batch_size(self) -> int: ...
    def fit(self, batch_size: int, rewards: list[float]) -> Arm: ...
    def next_exploration(
        self, explorations: Mapping[int, list[_Exploration]]
    ) -> tuple[Literal["explore", "wait", "done"], Any]: ...
    def decide(
        self,
        arms: list[Arm] | None,
        explorations: Mapping[int, list[_Exploration]],
        rewards: Mapping[int, list[float]],
        best_so_far: int,
        rng: NumpyRng,
    ) -> Decision: ...

@final
class PruningGts:
    def __new__(cls, policy: PruningGtsPolicy, concurrency: bool, seed: int) -> Self: ...
    def predict(self) -> int: ...
    def observe(self, batch_size: int, cost: float, converged: bool | None = None) -> None: ...
    @property
    def batch_sizes(self) -> list[int]: ...
    @property
    def default_batch_size(self) -> int: ...
    @property
    def in_bandit_stage(self) -> bool: ...
    @property
    def arms(self) -> list[Arm] | None: ...
    @property
    def expecting(self) -> int | None: ...
    @property
    def explorations(self) -> dict[int, list[_Exploration]]: ...
    @property
    def rng(self) -> NumpyRng: ...
    def __copy__(self) -> PruningGts: ...
    def __deepcopy__(self, memo: Any) -> PruningGts: ...

@final
class JitPowerLimit:
    def __new__(cls) -> Self: ...
    def predict(self, batch_size: int) -> int | None: ...
    def observe(self, batch_size: int, power_limit: int, cost: float) -> None: ...
    @property
    def best(self) -> dict[int, tuple[int, float]]: ...
    def __copy__(self) -> JitPowerLimit: ...
    def __deepcopy__(self, memo: Any) -> JitPowerLimit: ...

def reward_precision(rewards: list[float]) -> float: ...
def bandit_fit_arm(
    arm: Arm, rewards: list[float], reset: bool, prior_mean: float, prior_precision: float
) -> Arm: ...
def thompson_predict(arms: list[Arm], num_explorations: int, rng: NumpyRng) -> int: ...
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
) -> tuple[bool, bool, str]: ...

# (rec, try, batch_size, power_limit, energy, time, reached)
_HistoryRow: TypeAlias = tuple[int, int, int, int, float, float, bool]

class _BatchSizePolicy(Protocol):
    def predict(self, job: Any, /) -> int: ...
    def observe(self, job: Any, batch_size: int, cost: float, reached: bool, /) -> object: ...

class _PowerLimitPolicy(Protocol):
    def predict(self, job: Any, batch_size: int, /) -> int | None: ...
    def observe(self, job: Any, batch_size: int, power_limit: int, cost: float, /) -> object: ...

@final
class SimTable:
    def __new__(
        cls,
        dataset: str,
        network: str,
        optimizer: str,
        target_metric: float,
        max_epochs: int,
        default_bs: int | None = None,
        *,
        train_path: str | None = None,
        power_path: str | None = None,
        train_text: str | None = None,
        power_text: str | None = None,
    ) -> SimTable: ...
    @staticmethod
    def builtin(trace_dir: str, gpu: str, workload: str) -> SimTable: ...
    # (dataset, network, optimizer, target_metric, max_epochs, default_bs)
    @staticmethod
    def builtin_workloads() -> list[tuple[str, str, str, float, int, int]]: ...
    @property
    def batch_sizes(self) -> list[int]: ...
    def power_limits(self, batch_size: int) -> list[int]: ...
    @property
    def num_power_limits(self) -> int: ...
    @property
    def max_power(self) -> float: ...
    @property
    def default_bs(self) -> int: ...
    # (dataset, network, optimizer, target_metric, max_epochs)
    @property
    def job(self) -> tuple[str, str, str, float, int]: ...
    def paths(self, batch_size: int) -> list[float | None]: ...
    def profile_power_limits(self, batch_size: int, eta: float) -> list[tuple[int, float]]: ...
    @property
    def default_recurrences(self) -> int: ...
    def simulate_zeus(
        self,
        seed: int,
        eta: float,
        beta: float,
        recurrences: int,
        prior_mean: float = 0.0,
        prior_precision: float = 0.0,
        window_size: int = 0,
        bandit_seed: int | None = None,
    ) -> list[_HistoryRow]: ...
    def simulate_default(self, seed: int, eta: float, recurrences: int) -> list[_HistoryRow]: ...
    def simulate_with(
        self,
        job: Any,
        batch_size_optimizer: _BatchSizePolicy,
        power_limit_optimizer: _PowerLimitPolicy,
        seed: int,
        eta: float,
        beta: float,
        recurrences: int,
    ) -> list[_HistoryRow]: ...
