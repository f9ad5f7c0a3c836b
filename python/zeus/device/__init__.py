"""Devices: `get_gpus()` and `get_cpus()`, with their exceptions; Zeus 0.16's `get_soc()`."""

from zeus.device.cpu import CPUs, get_cpus
from zeus.device.exception import *  # noqa: F403
from zeus.device.exception import __all__ as _exception_names
from zeus.device.gpu import GPUs, get_gpus, reset_gpus
from zeus.device.soc import get_soc

__all__ = ["CPUs", "GPUs", "get_cpus", "get_gpus", "get_soc", "reset_gpus", *_exception_names]
