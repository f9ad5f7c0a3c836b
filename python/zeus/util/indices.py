"""The one check of device-index arguments (`gpu_indices=`, `cpu_indices=`) across zeus."""

from __future__ import annotations

from typing import Iterable, Optional


def check_indices(what: str, indices: Optional[Iterable[int]]) -> Optional[list[int]]:
    """`indices` as a list, or None for None; a clear `ValueError` naming `what` otherwise.

    Device indices are ints >= 0 (not bools), each given once, in a list or any other
    iterable but a string.

    Raises:
        ValueError: not a list of indices, an element that is no index, or one given twice.

    """
    if indices is None:
        return None
    if isinstance(indices, (str, bytes)):
        raise ValueError(f"{what}={indices!r}: expected a list of device indices, not a string")
    try:
        out = list(indices)
    except TypeError:
        raise ValueError(f"{what}={indices!r}: expected a list of device indices") from None
    for i in out:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"{what}={out!r}: {i!r} is not a device index (an int >= 0)")
    seen: set[int] = set()
    for i in out:
        if i in seen:
            raise ValueError(f"{what}={out!r}: device {i} appears twice")
        seen.add(i)
    return [int(i) for i in out]
