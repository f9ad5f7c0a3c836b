"""CPU package and DRAM energy from RAPL: `get_cpus()`, `CPUs` and the CPU exceptions.

Zeus 0.16's module layout: `zeus.device.cpu.get_cpus()` returns a `CPUs` object whose
`get_total_energy_consumption(index)` gives a `CpuDramMeasurement` in mJ.
"""

from zeus.device.cpu.exception import *  # noqa: F403
from zeus.device.cpu.exception import __all__ as _exception_names
from zeus.device.cpu.rapl import CpuDramMeasurement, CPUs, get_cpus

__all__ = ["CPUs", "CpuDramMeasurement", "get_cpus", *_exception_names]
