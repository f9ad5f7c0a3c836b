"""GPU devices: `get_gpus()` and the GPU exceptions."""

from zeus.device.exception import *  # noqa: F403
from zeus.device.exception import __all__ as _exception_names
from zeus.device.gpu import GPUs, get_gpus, reset_gpus

__all__ = ["GPUs", "get_gpus", "reset_gpus", *_exception_names]
