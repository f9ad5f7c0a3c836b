"""Devices: `get_gpus()` and `get_cpus()`, with their exceptions."""

from zeus.device.cpu import CPUs, get_cpus
from zeus.device.exception import *  # noqa: F403
from zeus.device.exception import __all__ as _exception_names
from zeus.device.gpu import GPUs, get_gpus, reset_gpus

__all__ = ["CPUs", "GPUs", "get_cpus", "get_gpus", "reset_gpus", *_exception_names]
