"""GPU exceptions, with the reference's names.

Every NVML return code maps to one of these (the table is in the Rust core,
`crates/zeus-core/src/device/error.rs`). The Rust extension looks these classes up by name, so
renaming one here is a breaking change on both sides.
"""

from __future__ import annotations

from zeus.exception import ZeusBaseError


class ZeusBaseGPUError(ZeusBaseError):
    """Base class of GPU errors."""

    cli_hint = "python -m zeus.show_env shows what zeus finds"


class ZeusGPUInitError(ZeusBaseGPUError):
    """The GPU library could not be initialised (or a backend setting is wrong)."""


class ZeusGPUInvalidArgError(ZeusBaseGPUError):
    """An argument was invalid (for example a power limit outside the device's range)."""


class ZeusGPUNotSupportedError(ZeusBaseGPUError):
    """The device does not support the operation (for example the energy counter before Volta)."""


class ZeusGPUNoPermissionError(ZeusBaseGPUError):
    """The operation needs privileges the process does not have (root or SYS_ADMIN)."""


class ZeusGPUAlreadyInitializedError(ZeusBaseGPUError):
    """The library was already initialised."""


class ZeusGPUNotFoundError(ZeusBaseGPUError):
    """The device or object was not found."""


class ZeusGPUInsufficientSizeError(ZeusBaseGPUError):
    """A buffer was too small."""


class ZeusGPUInsufficientPowerError(ZeusBaseGPUError):
    """The device's external power cables are not properly attached."""


class ZeusGPUDriverNotLoadedError(ZeusBaseGPUError):
    """The NVIDIA driver is not loaded."""


class ZeusGPUTimeoutError(ZeusBaseGPUError):
    """The operation timed out."""


class ZeusGPUIRQError(ZeusBaseGPUError):
    """The kernel detected an interrupt issue with the GPU."""


class ZeusGPULibraryNotFoundError(ZeusBaseGPUError):
    """The GPU library (NVML) could not be found or loaded."""

    cli_summary = "NVML (libnvidia-ml.so.1) could not be loaded: no NVIDIA GPU can be used"
    cli_hint = (
        "on a machine without one, ZEUS_GPU_BACKEND=sim uses the simulated GPU; "
        "python -m zeus.show_env shows what zeus finds"
    )


class ZeusGPUFunctionNotFoundError(ZeusBaseGPUError):
    """The loaded GPU library lacks a function."""


class ZeusGPUCorruptedInfoROMError(ZeusBaseGPUError):
    """The device's infoROM is corrupted."""


class ZeusGPULostError(ZeusBaseGPUError):
    """The GPU fell off the bus or became inaccessible."""


class ZeusGPUResetRequiredError(ZeusBaseGPUError):
    """The GPU needs a reset."""


class ZeusGPUOperatingSystemError(ZeusBaseGPUError):
    """The operating system blocked the request."""


class ZeusGPULibRMVersionMismatchError(ZeusBaseGPUError):
    """The NVML library and the kernel driver versions do not match."""


class ZeusGPUMemoryError(ZeusBaseGPUError):
    """The GPU ran out of memory for the request."""


class ZeusGPUUnknownError(ZeusBaseGPUError):
    """Any other error."""


class ZeusdError(ZeusBaseGPUError):
    """zeusd, the privileged GPU daemon, could not do what was asked (`zeus.device.zeusd`).

    An HTTP error status of the daemon maps to the GPU exception of the same meaning instead
    (403 is `ZeusGPUNoPermissionError`, 400 `ZeusGPUInvalidArgError`, ...).
    """


class ZeusdConfigError(ZeusdError):
    """`ZEUSD_SOCK_PATH` / `ZEUSD_HOST_PORT` are both set, or one is malformed."""


class ZeusdConnectionError(ZeusdError, ConnectionError):
    """zeusd does not answer at the configured socket or address.

    Also a `ConnectionError`: the reference's `PowerStreamingClient` raises that for a daemon it
    cannot reach, and code written for it catches it.
    """

    cli_hint = (
        "check the address and that zeusd runs there (systemctl status zeusd, or start it "
        "as the message shows)"
    )


class ZeusdSettingHeldError(ZeusdError):
    """zeusd refused a write (HTTP 409): another live client holds that GPU setting.

    The answer's `conflicts` name the holders; the setting frees when they release it or exit.
    """


class ZeusBaseCPUError(ZeusBaseError):
    """Base class of CPU (RAPL) errors; the classes are in `zeus.device.cpu`."""


class ZeusBaseSoCError(ZeusBaseError):
    """Base class of SoC errors (Zeus 0.16's); the one class is in `zeus.device.soc`."""


__all__ = [
    "ZeusBaseCPUError",
    "ZeusBaseSoCError",
    "ZeusBaseGPUError",
    "ZeusGPUInitError",
    "ZeusGPUInvalidArgError",
    "ZeusGPUNotSupportedError",
    "ZeusGPUNoPermissionError",
    "ZeusGPUAlreadyInitializedError",
    "ZeusGPUNotFoundError",
    "ZeusGPUInsufficientSizeError",
    "ZeusGPUInsufficientPowerError",
    "ZeusGPUDriverNotLoadedError",
    "ZeusGPUTimeoutError",
    "ZeusGPUIRQError",
    "ZeusGPULibraryNotFoundError",
    "ZeusGPUFunctionNotFoundError",
    "ZeusGPUCorruptedInfoROMError",
    "ZeusGPULostError",
    "ZeusGPUResetRequiredError",
    "ZeusGPUOperatingSystemError",
    "ZeusGPULibRMVersionMismatchError",
    "ZeusGPUMemoryError",
    "ZeusGPUUnknownError",
    "ZeusdError",
    "ZeusdConfigError",
    "ZeusdConnectionError",
    "ZeusdSettingHeldError",
]
