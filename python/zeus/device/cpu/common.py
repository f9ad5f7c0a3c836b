"""Zeus 0.16's `zeus.device.cpu.common`: `CPUs`, `CpuDramMeasurement` and the CPU exceptions.

The same objects as `zeus.device.cpu` (one implementation, in `rapl.py` and
`exception.py`). Zeus 0.16's per-package `CPU` class and its `EmptyCPUs` have no counterpart:
`CPUs` addresses packages by index, and a monitor without CPUs has `cpu_indices` None.
"""

from zeus.device.cpu.exception import *  # noqa: F403
from zeus.device.cpu.exception import __all__ as _exception_names
from zeus.device.cpu.rapl import CpuDramMeasurement, CPUs

__all__ = ["CPUs", "CpuDramMeasurement", *_exception_names]
