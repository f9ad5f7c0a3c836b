"""Zeus 0.16's `zeus.device.gpu.common`: `GPUs` and the GPU exceptions.

The same objects as `zeus.device.gpu` and `zeus.device.exception` (one implementation).
Zeus 0.16's per-GPU `GPU` class, `EmptyGPUs` and `ZeusGPUHeterogeneousError` have no
counterpart: `GPUs` addresses GPUs by index, a CPU-only monitor has `gpus` None, and
`get_gpus(ensure_homogeneous=True)` raises `ZeusGPUInitError` for mixed models.
"""

from zeus.device.exception import *  # noqa: F403
from zeus.device.exception import __all__ as _exception_names
from zeus.device.gpu import GPUs

__all__ = ["GPUs", *_exception_names]
