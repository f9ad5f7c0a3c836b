"""Synchronising with the deep-learning framework (PyTorch, JAX, CuPy), all optional.

One path syncs for every caller (`ZeusMonitor`'s windows, `zeus.metric`, Perseus, `cuda_sync`):
`imported_sync` looks only at the frameworks the program has imported. Only those can have
queued GPU work, and importing one to ask (PyTorch takes seconds) would cost a program that
uses none. `sync_execution` (Zeus 0.16) is the one door that imports the framework it is
named, because the caller named it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from functools import lru_cache
from typing import Callable, Literal

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
