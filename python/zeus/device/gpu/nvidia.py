"""Zeus 0.16's `zeus.device.gpu.nvidia`: `NVIDIAGPUs` and `nvml_is_available`.

`NVIDIAGPUs` is `zeus.device.gpu.GPUs` (NVML-backed, or the simulator with
`ZEUS_GPU_BACKEND=sim`), and `get_gpus()` returns one, as in Zeus 0.16. Its per-GPU
`NVIDIAGPU` and `ZeusdNVIDIAGPU` have no counterpart: `GPUs` addresses GPUs by index, and
writes go through zeusd when `ZEUSD_SOCK_PATH` or `ZEUSD_HOST_PORT` is set.
"""

from __future__ import annotations

from zeus.device.exception import ZeusBaseGPUError
from zeus.device.gpu import GPUs, get_gpus

__all__ = ["NVIDIAGPUs", "nvml_is_available"]

NVIDIAGPUs = GPUs


def nvml_is_available() -> bool:
    """Whether this process's GPUs come from NVML.

    Opens the process-wide `GPUs` (`get_gpus()`) if it is not open yet. False when NVML
    cannot be opened (no driver, no library) or when the simulator stands in for it
    (`ZEUS_GPU_BACKEND=sim`).
    """
    try:
        return get_gpus().backend == "nvml"
    except ZeusBaseGPUError:
        return False
