"""The visible GPUs, as one object addressed by GPU index.

Index *i* is the *i*-th GPU visible to this process (after `CUDA_VISIBLE_DEVICES`), which is
what PyTorch calls `cuda:i`. Units: mW, mJ, MHz.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable

from zeus import _core
from zeus.device.exception import *  # noqa: F403  (re-exported, as in the reference)
from zeus.device.exception import __all__ as _exception_names


class GPUs(_core.GPUs):
    """The GPUs visible to this process.

    Method names follow the reference's GPU API (`get_name(i)`,
    `set_power_management_limit(i, mw)`, ...); every method takes the GPU index first. The
    camelCase names of zeus 0.8 (`getName`, `setPowerManagementLimit`, ...) still work and warn.
    """


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

    Raises:
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
