"""zeus.util.framework on a machine without a GPU framework."""

from __future__ import annotations

import importlib.util

import pytest
from zeus.util import framework


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) for m in ("torch", "jax", "cupy"))
    and framework.sync_available(),
    reason="a framework with GPU support is installed",
)
def test_cuda_sync_without_frameworks_raises() -> None:
    assert framework.sync_available() is False
    with pytest.raises(RuntimeError, match="No frameworks are available."):
        framework.cuda_sync()


def test_availability_is_cached() -> None:
    assert framework.torch_is_available() is framework.torch_is_available()
    assert framework.torch_is_available.cache_info().hits >= 1
