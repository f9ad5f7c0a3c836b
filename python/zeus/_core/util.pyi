# Hand-kept stubs of `zeus._core.util`: utilities (src/python/util.rs).
# Keep in sync with the #[pymethods] / #[pyfunction] signatures.

import os
from typing import TypeAlias

__all__ = [
    "zeus_cost",
]

_StrPath: TypeAlias = str | os.PathLike[str]

def zeus_cost(energy: float, time: float, eta_knob: float, max_power: float) -> float: ...
