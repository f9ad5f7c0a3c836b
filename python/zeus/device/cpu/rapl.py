"""The CPU packages whose energy RAPL measures, as one object addressed by package index.

Energy figures are cumulative and unwrapped: the Rust core keeps one total per RAPL zone for
the whole process, advanced by every read, and a monitor's sampler lease reads the zones often
enough that no counter wrap is missed. Units here are mJ, as in Zeus 0.16.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from zeus import _core


@dataclass(frozen=True)
class CpuDramMeasurement:
    """Cumulative energy of one CPU package and of its DRAM.

    Attributes:
        cpu_mj: Package energy, mJ.
        dram_mj: DRAM energy, mJ, or `None` when the package has no DRAM zone.

    """

    cpu_mj: float
    dram_mj: float | None = None


class CPUs(_core.device.CPUs):
    """The CPU packages found through RAPL (or simulated with `ZEUS_SIM_CPUS=N`).

    `len(cpus)` is the number of packages; every method takes the package index first.
    """

    def get_total_energy_consumption(self, index: int) -> CpuDramMeasurement:
        """Read package `index`'s cumulative package and DRAM energy now.

        Raises:
            ZeusCPUNotFoundError: No package `index`.
            ZeusRAPLPermissionError: An `energy_uj` file became unreadable (the message names
                it and says what to do).

        """
        cpu_mj, dram_mj = self._total_energy_mj(index)
        return CpuDramMeasurement(cpu_mj=cpu_mj, dram_mj=dram_mj)

    def getTotalEnergyConsumption(self, index: int) -> CpuDramMeasurement:
        """Zeus 0.16's name of `get_total_energy_consumption`."""
        return self.get_total_energy_consumption(index)

    def supportsGetDramEnergyConsumption(self, index: int) -> bool:
        """Zeus 0.16's name of `supports_get_dram_energy_consumption`."""
        return self.supports_get_dram_energy_consumption(index)


_cpus: CPUs | None = None
_cpus_lock = threading.Lock()


def get_cpus() -> CPUs:
    """Return the process-wide `CPUs` object, finding the RAPL zones on first use.

    The zones are looked for under `ZEUS_RAPL_ROOT` if set, else `/sys/class/powercap`.
    `ZEUS_SIM_CPUS=N` opts in to N simulated packages instead (see `zeus.device.sim`); there is
    never a silent fallback to them.

    Raises:
        ZeusRAPLNotSupportedError: No RAPL package zone (the message names the directory).
        ZeusRAPLPermissionError: An `energy_uj` file is not readable (the message names it and
            the fixes: root, a udev rule or `chmod a+r`, or a readable copy in a container).
        ZeusRAPLFileInitError: A RAPL file holds something unexpected.

    """
    global _cpus
    with _cpus_lock:
        if _cpus is None:
            _cpus = CPUs()
        return _cpus
