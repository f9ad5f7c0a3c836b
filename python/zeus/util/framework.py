"""Synchronising with the deep-learning framework (PyTorch, JAX, CuPy), all optional."""

from __future__ import annotations

import importlib.util
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


def sync_available() -> bool:
    """Whether any framework can synchronise a GPU here."""
    return torch_is_available() or jax_is_available() or cupy_is_available()


def cuda_sync(device: int | None = None) -> None:
    """Wait for the GPU work queued by the framework to finish.

    Uses PyTorch, else JAX, else CuPy.

    Raises:
        RuntimeError: no framework with GPU support is available.

    """
    if torch_is_available():
        import torch

        torch.cuda.synchronize(device)
        return
    if jax_is_available():
        import jax

        (jax.device_put(0.0) + 0).block_until_ready()
        return
    if cupy_is_available():
        import cupy

        dev: Any = cupy.cuda.Device(device) if device is not None else cupy.cuda.Device()
        dev.synchronize()
        return
    raise RuntimeError("No frameworks are available.")


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


def syncer(sync_with: str) -> Callable[[int], None] | None:
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

        return lambda i: torch.cuda.synchronize(i)
    if sync_with == "jax" and jax_is_available():
        import jax

        def jax_sync(i: int) -> None:
            gpus = [d for d in jax.devices() if d.platform == "gpu"]
            (jax.device_put(0.0, gpus[i]) + 0).block_until_ready()

        return jax_sync
    if sync_with == "cupy" and cupy_is_available():
        import cupy

        return lambda i: cupy.cuda.Device(i).synchronize()
    return None
