"""The visible GPUs, as one object addressed by GPU index.

Index *i* is the *i*-th GPU visible to this process (after `CUDA_VISIBLE_DEVICES`, or on AMD
`ROCR_VISIBLE_DEVICES` then `HIP_VISIBLE_DEVICES`), which is what PyTorch calls `cuda:i`.
Units: mW, mJ, MHz.

With `ZEUSD_SOCK_PATH` or `ZEUSD_HOST_PORT` set (`zeus.device.zeusd`), the setters (power
limit, persistence mode, locked graphics and memory clocks, and their resets) ask zeusd, the
privileged daemon, to make the change; every getter still reads the device directly.

Zeus 0.16's submodules name the same objects: `zeus.device.gpu.common` (`GPUs`, the
exceptions), `zeus.device.gpu.nvidia` (`NVIDIAGPUs`, `nvml_is_available`) and
`zeus.device.gpu.amd` (`AMDGPUs`, `amdsmi_is_available`).
"""

from __future__ import annotations

import operator
import threading
import warnings
from typing import Any, Callable, Optional

from zeus import _core
from zeus.device.exception import *  # noqa: F403  (re-exported, as in the reference)
from zeus.device.exception import ZeusGPUInvalidArgError
from zeus.device.exception import __all__ as _exception_names
from zeus.device.zeusd import ZeusdClient


class GPUs(_core.device.GPUs):
    """The GPUs visible to this process.

    Method names follow the reference's GPU API (`get_name(i)`,
    `set_power_management_limit(i, mw)`, ...); every method takes the GPU index first. The
    camelCase names of zeus 0.8 (`getName`, `setPowerManagementLimit`, ...) still work and warn.

    The daemon switch is read from the environment when the object is made: `zeusd` is the
    client writes go through, or None when they are made directly.

    Raises:
        ZeusdConfigError: `ZEUSD_SOCK_PATH` and `ZEUSD_HOST_PORT` are both set, or
            `ZEUSD_HOST_PORT` is malformed.

    """

    zeusd: Optional[ZeusdClient]

    def __init__(self, ensure_homogeneous: bool = False) -> None:
        # `_core.device.GPUs.__new__` opened the backend (and checked AMD energy counters);
        # only the write path is decided here.
        self.zeusd = ZeusdClient.from_env()
        for note in self.notes:
            warnings.warn(note, stacklevel=2)

    def _daemon_index(self, gpu_index: int) -> int:
        """The daemon's index of GPU `gpu_index` (the NVML index, not renumbered)."""
        index = operator.index(gpu_index)
        physical = self.physical_indices
        if isinstance(gpu_index, bool) or not 0 <= index < len(physical):
            raise ZeusGPUInvalidArgError(
                f"GPU index {gpu_index!r} is out of range: {len(physical)} GPU(s) are visible"
            )
        return physical[index]

    def release_setting(self, gpu_index: int, setting: str) -> None:
        """Give back this process's hold of a setting on GPU `gpu_index` through zeusd.

        `setting` is `"power_limit"` or `"clocks"`; the daemon restores it unless another
        client holds it too.
        """
        if self.zeusd is None:
            raise ZeusGPUInvalidArgError("release_setting needs GPU writes through zeusd")
        self.zeusd.release([self._daemon_index(gpu_index)], setting)

    def set_power_management_limit(
        self, gpu_index: int, power_limit_mw: int, block: bool = True
    ) -> None:
        """Set GPU `gpu_index`'s power limit, mW (through zeusd when configured)."""
        if self.zeusd is None:
            return super().set_power_management_limit(gpu_index, power_limit_mw, block)
        self.zeusd.set_power_limit([self._daemon_index(gpu_index)], power_limit_mw, block)

    def reset_power_management_limit(self, gpu_index: int, block: bool = True) -> None:
        """Set GPU `gpu_index`'s power limit back to its default (through zeusd when configured).

        zeusd has no reset endpoint: the default is read here and set through the daemon.
        """
        if self.zeusd is None:
            return super().reset_power_management_limit(gpu_index, block)
        default = self.get_default_power_management_limit(gpu_index)
        self.zeusd.set_power_limit([self._daemon_index(gpu_index)], default, block)

    def set_persistence_mode(self, gpu_index: int, enabled: bool, block: bool = True) -> None:
        """Turn persistence mode on or off (through zeusd when configured)."""
        if self.zeusd is None:
            return super().set_persistence_mode(gpu_index, enabled, block)
        self.zeusd.set_persistence_mode([self._daemon_index(gpu_index)], enabled, block)

    def set_gpu_locked_clocks(
        self, gpu_index: int, min_clock_mhz: int, max_clock_mhz: int, block: bool = True
    ) -> None:
        """Lock the graphics clock to a range, MHz (through zeusd when configured)."""
        if self.zeusd is None:
            return super().set_gpu_locked_clocks(gpu_index, min_clock_mhz, max_clock_mhz, block)
        self.zeusd.set_gpu_locked_clocks(
            [self._daemon_index(gpu_index)], min_clock_mhz, max_clock_mhz, block
        )

    def reset_gpu_locked_clocks(self, gpu_index: int, block: bool = True) -> None:
        """Unlock the graphics clock (through zeusd when configured)."""
        if self.zeusd is None:
            return super().reset_gpu_locked_clocks(gpu_index, block)
        self.zeusd.reset_gpu_locked_clocks([self._daemon_index(gpu_index)], block)

    def set_memory_locked_clocks(
        self, gpu_index: int, min_clock_mhz: int, max_clock_mhz: int, block: bool = True
    ) -> None:
        """Lock the memory clock to a range, MHz (through zeusd when configured)."""
        if self.zeusd is None:
            return super().set_memory_locked_clocks(gpu_index, min_clock_mhz, max_clock_mhz, block)
        self.zeusd.set_mem_locked_clocks(
            [self._daemon_index(gpu_index)], min_clock_mhz, max_clock_mhz, block
        )

    def reset_memory_locked_clocks(self, gpu_index: int, block: bool = True) -> None:
        """Unlock the memory clock (through zeusd when configured)."""
        if self.zeusd is None:
            return super().reset_memory_locked_clocks(gpu_index, block)
        self.zeusd.reset_mem_locked_clocks([self._daemon_index(gpu_index)], block)


# camelCase aliases of zeus 0.8, kept so code written for it keeps working.
_CAMEL_ALIASES = {
    "getName": "get_name",
    "getPowerManagementLimitConstraints": "get_power_management_limit_constraints",
    "setPersistenceMode": "set_persistence_mode",
    "setPowerManagementLimit": "set_power_management_limit",
    "resetPowerManagementLimit": "reset_power_management_limit",
    "setMemoryLockedClocks": "set_memory_locked_clocks",
    "getSupportedMemoryClocks": "get_supported_memory_clocks",
    "getSupportedGraphicsClocks": "get_supported_graphics_clocks",
    "setGpuLockedClocks": "set_gpu_locked_clocks",
    "resetMemoryLockedClocks": "reset_memory_locked_clocks",
    "resetGpuLockedClocks": "reset_gpu_locked_clocks",
    "getPowerUsage": "get_average_power_usage",
    "supportsGetTotalEnergyConsumption": "supports_get_total_energy_consumption",
    "getTotalEnergyConsumption": "get_total_energy_consumption",
}


def _make_alias(old: str, new: str) -> Callable[..., Any]:
    def alias(self: GPUs, *args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"GPUs.{old} is deprecated; use GPUs.{new}", DeprecationWarning, stacklevel=2)
        return getattr(self, new)(*args, **kwargs)

    alias.__name__ = old
    alias.__doc__ = f"Deprecated alias of `{new}`."
    return alias


for _old, _new in _CAMEL_ALIASES.items():
    setattr(GPUs, _old, _make_alias(_old, _new))

_gpus: GPUs | None = None
_gpus_lock = threading.Lock()


def get_gpus(ensure_homogeneous: bool = False) -> GPUs:
    """Return the process-wide `GPUs` object, opening the backend on first use.

    The backend is NVML unless `ZEUS_GPU_BACKEND=sim` opts in to the simulated GPU; there is
    never a silent fallback. Unlike the reference, `ensure_homogeneous` is checked on every call.

    With `ZEUSD_SOCK_PATH` or `ZEUSD_HOST_PORT` set, its setters go through zeusd (see
    `GPUs`); `reset_gpus()` makes the next call read the variables again.

    Raises:
        ZeusdConfigError: the zeusd variables are both set or malformed.
        ZeusGPULibraryNotFoundError: NVML is not installed (the message says how to simulate).
        ZeusGPUInvalidArgError: `CUDA_VISIBLE_DEVICES` is malformed or out of range.
        ZeusGPUInitError: the backend could not start, or the GPUs differ and
            `ensure_homogeneous` is set.

    """
    global _gpus
    with _gpus_lock:
        if _gpus is None:
            _gpus = GPUs(False)
        gpus = _gpus
    if ensure_homogeneous:
        gpus.ensure_homogeneous()
    return gpus


def reset_gpus() -> None:
    """Forget the process-wide `GPUs` object (tests, or after changing the environment)."""
    global _gpus
    with _gpus_lock:
        _gpus = None


__all__ = ["GPUs", "get_gpus", "reset_gpus", *_exception_names]
