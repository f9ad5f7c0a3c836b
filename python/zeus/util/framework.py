"""Synchronising with the deep-learning framework (PyTorch, JAX, CuPy), all optional.

One path syncs for every caller (`ZeusMonitor`'s windows, `zeus.metric`, Perseus, `cuda_sync`):
`imported_sync` looks only at the frameworks the program has imported. Only those can have
queued GPU work, and importing one to ask (PyTorch takes seconds) would cost a program that
uses none. `sync_execution` (Zeus 0.16) is the one door that imports the framework it is
named, because the caller named it.

The collective helpers (`process_group`, `rank`, `world_size`, `all_reduce`,
`broadcast_object`) are the one door to `torch.distributed` for the optimizers and
`zeus.profile`. They never import PyTorch: a program that has not imported it cannot have
started a process group, so this process is then rank 0 of a world of one.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, Callable, Literal

SyncWith = Literal["torch", "jax", "cupy"]
FRAMEWORKS: tuple[SyncWith, ...] = ("torch", "jax", "cupy")


@lru_cache(maxsize=1)
def torch_is_available() -> bool:
    """Whether PyTorch is importable and sees a CUDA device."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@lru_cache(maxsize=1)
def jax_is_available() -> bool:
    """Whether JAX is importable and has a GPU backend."""
    if importlib.util.find_spec("jax") is None:
        return False
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except Exception:
        return False


@lru_cache(maxsize=1)
def cupy_is_available() -> bool:
    """Whether CuPy is importable and sees a CUDA device."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


def imported_sync(sync_with: SyncWith | None = None) -> Callable[[int | None], None] | None:
    """The function syncing one GPU through the framework the program imported, or None.

    With `sync_with`, only that framework; else PyTorch, then JAX, then CuPy, the first that
    is imported and sees a GPU. None when none is: nothing can have been queued through a
    framework that is not imported. No framework is imported here.
    """
    for name in FRAMEWORKS if sync_with is None else (sync_with,):
        if name in sys.modules:
            sync = syncer(name)
            if sync is not None:
                return sync
    return None


def sync_available() -> bool:
    """Whether a framework the program imported can synchronise a GPU here."""
    return imported_sync() is not None


def cuda_sync(device: int | None = None) -> None:
    """Wait for the GPU work queued by the framework the program imported to finish.

    Uses PyTorch, else JAX, else CuPy (see `imported_sync`).

    Args:
        device: The framework's GPU index; None is the framework's current GPU.

    Raises:
        RuntimeError: no imported framework with GPU support.

    """
    sync = imported_sync()
    if sync is None:
        raise RuntimeError("No frameworks are available.")
    sync(device)


def sync_execution(gpu_devices: Iterable[int], sync_with: SyncWith = "torch") -> None:
    """Wait for the work `sync_with` queued on `gpu_devices` to finish (Zeus 0.16's function).

    Args:
        gpu_devices: Framework GPU indices (after `CUDA_VISIBLE_DEVICES`).
        sync_with: `"torch"`, `"jax"` or `"cupy"`.

    Raises:
        ValueError: `sync_with` is not one of the three.
        RuntimeError: that framework is not installed or sees no GPU.

    """
    sync = syncer(sync_with)
    if sync is None:
        raise RuntimeError(f"sync_with={sync_with!r}: that framework is not available with a GPU")
    for i in gpu_devices:
        sync(i)


def syncer(sync_with: str) -> Callable[[int | None], None] | None:
    """The function syncing one GPU through framework `sync_with`.

    None when that framework is not available with a GPU: nothing can have been queued
    through it then.

    Raises:
        ValueError: `sync_with` is not `"torch"`, `"jax"` or `"cupy"`.

    """
    if sync_with not in FRAMEWORKS:
        raise ValueError(
            f"sync_with={sync_with!r}: expected one of {', '.join(repr(f) for f in FRAMEWORKS)}"
        )
    if sync_with == "torch" and torch_is_available():
        import torch

        return lambda i: torch.cuda.synchronize(i)  # None: the current device
    if sync_with == "jax" and jax_is_available():
        import jax

        def jax_sync(i: int | None) -> None:
            gpus = [d for d in jax.devices() if d.platform == "gpu"]
            (jax.device_put(0.0, gpus[i or 0]) + 0).block_until_ready()

        return jax_sync
    if sync_with == "cupy" and cupy_is_available():
        import cupy

        def cupy_sync(i: int | None) -> None:
            (cupy.cuda.Device(i) if i is not None else cupy.cuda.Device()).synchronize()

        return cupy_sync
    return None


def process_group() -> Any:
    """`torch.distributed` when the program started a process group of several ranks, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() <= 1:
        return None
    return dist


def rank() -> int:
    """The rank of this process (0 without a process group)."""
    dist = process_group()
    return 0 if dist is None else int(dist.get_rank())


def world_size() -> int:
    """The number of ranks (1 without a process group)."""
    dist = process_group()
    return 1 if dist is None else int(dist.get_world_size())


def all_reduce(values: list[float], op: Literal["sum", "max"]) -> list[float]:
    """Combine `values` element-wise across ranks with `op`; every rank gets the result.

    Args:
        values: This rank's numbers; every rank passes as many, in the same order.
        op: `"sum"` or `"max"`.

    Returns:
        The combined numbers (a copy of `values` without a process group).

    """
    if op not in ("sum", "max"):
        raise ValueError(f"op={op!r}: expected 'sum' or 'max'")
    dist = process_group()
    if dist is None:
        return [float(v) for v in values]
    import torch

    # NCCL reduces only tensors on the rank's GPU; Gloo and MPI take CPU tensors.
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return [float(v) for v in tensor.tolist()]


def broadcast_object(obj: Any, src: int = 0, rank: int | None = None) -> Any:
    """Rank `src`'s picklable `obj` on every rank (`obj` itself without a process group).

    Args:
        obj: What rank `src` sends; ignored on the other ranks.
        src: The sending rank.
        rank: This process's rank where the caller was told it; else the process group's.

    """
    dist = process_group()
    if dist is None:
        return obj
    if rank is None:
        rank = int(dist.get_rank())
    box = [obj if rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]
