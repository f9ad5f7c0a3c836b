# Hand-kept stubs of `zeus._core.perseus`: Perseus (src/python/perseus.rs).
# Keep in sync with the #[pymethods] / #[pyfunction] signatures.

import os
from typing import Self, TypeAlias, final

__all__ = [
    "PerseusFrontier",
    "PerseusPipeline",
    "pipeline_1f1b",
    "makespan",
    "compute_frontier",
]

_StrPath: TypeAlias = str | os.PathLike[str]

@final
class PerseusFrontier:
    # No constructor: instances come from `compute_frontier`.
    def __len__(self) -> int: ...
    @property
    def unit_time(self) -> float: ...
    @property
    def time_units(self) -> list[int]: ...
    @property
    def times(self) -> list[float]: ...
    @property
    def costs(self) -> list[float]: ...
    def durations(self, k: int) -> list[int]: ...
    def choices(self, k: int) -> list[int]: ...
    def best_within(self, limit_s: float) -> int | None: ...

# Instruction names are "forward" or "backward".
@final
class PerseusPipeline:
    def __new__(
        cls,
        num_nodes: int,
        edges: list[tuple[int, int]],
        stage_of: list[int],
        options: list[list[tuple[float, float]]],
        blocking_power: list[float],
        unit_time: float | None = None,
    ) -> Self: ...
    @property
    def frontier(self) -> PerseusFrontier: ...
    @property
    def all_max(self) -> tuple[float, float]: ...
    def cost(self, choices: list[int]) -> tuple[float, float]: ...
    def best_within(self, slowdown: float) -> list[int]: ...

def pipeline_1f1b(
    num_stages: int, num_microbatches: int
) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]: ...
def makespan(num_nodes: int, edges: list[tuple[int, int]], durations: list[float]) -> float: ...
def compute_frontier(
    num_nodes: int,
    edges: list[tuple[int, int]],
    options: list[list[tuple[float, float]]],
    unit_time: float,
) -> PerseusFrontier: ...
