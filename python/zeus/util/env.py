"""Typed environment variables."""

from __future__ import annotations

import os
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def get_env(name: str, valtype: Callable[[str], T] | type[T], default: T | None = None) -> T:
    """Read environment variable `name` as `valtype`.

    Booleans accept `true`/`false` in any case and nothing else.

    Args:
        name: Variable name.
        valtype: Type (or parser) of the value.
        default: Returned when the variable is unset; `None` makes it required.

    Raises:
        ValueError: the variable is missing with no default, or a boolean is malformed.

    """
    if name not in os.environ:
        if default is not None:
            return default
        raise ValueError(f"Missing environment variable '{name}'")
    raw = os.environ[name]
    if valtype is bool:
        low = raw.lower()
        if low == "true":
            return True  # type: ignore[return-value]
        if low == "false":
            return False  # type: ignore[return-value]
        raise ValueError(f"Strange boolean environment variable value '{raw}'")
    parser: Callable[[str], Any] = valtype  # type: ignore[assignment]
    return parser(raw)
