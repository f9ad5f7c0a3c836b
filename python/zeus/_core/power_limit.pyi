# Hand-kept stubs of `zeus._core.power_limit`: power-limit selection (src/python/power_limit.rs).
# Keep in sync with the #[pymethods] / #[pyfunction] signatures.

import os
from typing import TypeAlias, final

__all__ = [
    "PowerLimitSelector",
]

_StrPath: TypeAlias = str | os.PathLike[str]

@final
class PowerLimitSelector:
    # No constructor: instances come from the static methods.
    @staticmethod
    def energy() -> PowerLimitSelector: ...
    @staticmethod
    def time() -> PowerLimitSelector: ...
    @staticmethod
    def zeus_cost(eta_knob: float, world_size: int) -> PowerLimitSelector: ...
    @staticmethod
    def max_slowdown(factor: float) -> PowerLimitSelector: ...
    def select(self, measurements: list[tuple[int, float, float]]) -> int: ...
