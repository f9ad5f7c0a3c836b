"""CPU package and DRAM energy from RAPL: `get_cpus()`, `CPUs` and the CPU exceptions.

Zeus 0.16's module layout: `zeus.device.cpu.get_cpus()` returns a `CPUs` object whose
`get_total_energy_consumption(index)` gives a `CpuDramMeasurement` in mJ;
`get_current_cpu_index()` is the package this process runs on (`topology.py`), and
`zeus.device.cpu.common` names the same classes at Zeus 0.16's path.
"""

from zeus.device.cpu.exception import *  # noqa: F403
from zeus.device.cpu.exception import __all__ as _exception_names
from zeus.device.cpu.rapl import CpuDramMeasurement, CPUs, get_cpus
from zeus.device.cpu.topology import get_current_cpu_index

__all__ = ["CPUs", "CpuDramMeasurement", "get_cpus", "get_current_cpu_index", *_exception_names]
