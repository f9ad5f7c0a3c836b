"""CPU (RAPL) exceptions, with Zeus 0.16's names.

The Rust core (`crates/zeus-core/src/device/cpu/error.rs`) looks these classes up by name in
`zeus.device.cpu`, so renaming one here is a breaking change on both sides.
"""

from __future__ import annotations

from zeus.device.exception import ZeusBaseCPUError


class ZeusCPUInitError(ZeusBaseCPUError):
    """The CPU energy interface could not be set up."""


class ZeusCPUNoPermissionError(ZeusBaseCPUError):
    """The process may not read the CPU energy counters."""


class ZeusCPUNotFoundError(ZeusBaseCPUError):
    """No CPU package with that index."""


class ZeusRAPLNotSupportedError(ZeusBaseCPUError):
    """No RAPL zones were found (often the case in virtual machines and containers)."""


class ZeusRAPLFileInitError(ZeusBaseCPUError):
    """A RAPL file could not be read or held something unexpected (the message names it)."""


class ZeusRAPLPermissionError(ZeusCPUNoPermissionError):
    """A RAPL `energy_uj` file is not readable; the message names it and the fixes."""


__all__ = [
    "ZeusBaseCPUError",
    "ZeusCPUInitError",
    "ZeusCPUNoPermissionError",
    "ZeusCPUNotFoundError",
    "ZeusRAPLFileInitError",
    "ZeusRAPLNotSupportedError",
    "ZeusRAPLPermissionError",
]
