"""A warning for monitors made at import time of a spawned process (Zeus 0.16's module).

A process started with the `spawn` method (the default on macOS and Windows, and what
PyTorch's `torch.multiprocessing.spawn` and CUDA-using `DataLoader` workers use) imports the
parent's main script again, under the name `__mp_main__`. Whatever that script does at module
level runs once more in every child: a monitor made there is made again, next to the model
and data the script loads at module level. `warn_if_global_in_subprocess` detects that and
says where to move the construction.
"""

from __future__ import annotations

import inspect
import warnings
from types import FrameType
from typing import Optional

__all__ = ["warn_if_global_in_subprocess"]

_SPAWNED_MAIN = "__mp_main__"


def _module_frame_of_spawned_main() -> Optional[FrameType]:
    """The module-level frame of a spawned child's re-imported main script on this stack.

    None when the stack has none: not in such a child, or not at its module level.
    """
    frame = inspect.currentframe()
    try:
        while frame is not None:
            code = frame.f_code
            if (
                code.co_name == "<module>"
                # The re-import itself runs from `<string>`/frozen importlib frames.
                and not code.co_filename.startswith("<")
                and frame.f_globals.get("__name__") == _SPAWNED_MAIN
            ):
                return frame
            frame = frame.f_back
        return None
    finally:
        del frame


def warn_if_global_in_subprocess(obj: object) -> None:
    """Warn when `obj` is being made at module level of a spawned process's main script.

    Monitors call this from their constructor. The `UserWarning` names `obj`'s class and
    points at the script's line that made it.

    Args:
        obj: The object being constructed (its class name goes into the message).

    """
    frame = _module_frame_of_spawned_main()
    if frame is None:
        return
    name = type(obj).__name__
    warnings.warn_explicit(
        f"{name} was created while a spawned process imported the main script again "
        "(as __mp_main__): it is made at module level, so every child process makes its own "
        "and reruns the script's other module-level code. Create it under "
        '`if __name__ == "__main__":` or inside a function.',
        UserWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=_SPAWNED_MAIN,
        registry=frame.f_globals.setdefault("__warningregistry__", {}),
    )
