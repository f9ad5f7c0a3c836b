"""Zeus 0.16's `zeus.device.gpu.amd`: `AMDGPUs` and `amdsmi_is_available`.

`AMDGPUs` is `zeus.device.gpu.GPUs`: the same object serves every vendor, and `get_gpus()`
opens AMD SMI when `ZEUS_GPU_BACKEND=amd`, or by default (`auto`) when NVML has no GPUs. The
Rust backend loads `libamd_smi.so` itself (no `amdsmi` Python package is needed), orders GPUs
as HIP does, honours `ROCR_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES`,
and checks each energy counter against power when the GPUs are opened (a warning says which
were disabled, and why). Zeus 0.16's per-GPU `AMDGPU` and `ZeusdAMDGPU` have no counterpart:
`GPUs` addresses GPUs by index, and writes go through zeusd when `ZEUSD_SOCK_PATH` or
`ZEUSD_HOST_PORT` is set. See `docs/amd.md`.
"""

from __future__ import annotations

from zeus.device.exception import ZeusBaseGPUError
from zeus.device.gpu import GPUs, get_gpus

__all__ = ["AMDGPUs", "amdsmi_is_available"]

AMDGPUs = GPUs


def amdsmi_is_available() -> bool:
    """Whether this process's GPUs come from AMD SMI.

    Opens the process-wide `GPUs` (`get_gpus()`) if it is not open yet. False when no AMD GPU
    can be opened, when NVML's GPUs were chosen, or when the simulator stands in
    (`ZEUS_GPU_BACKEND=sim`, even with simulated AMD models).
    """
    try:
        return get_gpus().backend == "amd"
    except ZeusBaseGPUError:
        return False
