"""Synchronising with the deep-learning framework (PyTorch, JAX, CuPy), all optional."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any


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
    except Exception:  # noqa: BLE001  (JAX raises many kinds when no backend exists)
        return False


@lru_cache(maxsize=1)
def cupy_is_available() -> bool:
    """Whether CuPy is importable and sees a CUDA device."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # noqa: BLE001
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
