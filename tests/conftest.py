"""Shared fixtures: the simulated GPU, the shared data directory, the fake NVML library.

The Prometheus and Pushgateway fixtures live in `prometheus_servers.py`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest
import zeus.device.sim
from zeus.device import GPUs, get_gpus

# Real Prometheus and Pushgateway servers (`pushgateway`, `prometheus_factory`).
pytest_plugins = ["prometheus_servers"]

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

_SIM_VARS = (
    "ZEUS_GPU_BACKEND",
    "ZEUS_SIM_GPUS",
    "ZEUS_SIM_CLOCK",
    "ZEUS_SIM_PRIVILEGED",
    "ZEUS_SIM_WORKLOAD",
    "ZEUS_SIM_LOAD",
    "ZEUS_SIM_FIDELITY",
    "ZEUS_SIM_SHARED",
    "ZEUS_NVML_LIB",
    "CUDA_VISIBLE_DEVICES",
    # A daemon configured in the developer's shell would route every GPU write of the tests.
    "ZEUSD_SOCK_PATH",
    "ZEUSD_HOST_PORT",
    "ZEUSD_TOKEN",
)


@pytest.fixture(autouse=True)
def _isolated_gpu_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts with no GPU configuration and a fresh simulator/GPU singleton.

    The simulated GPU runs at ideal fidelity (exact, free readings) unless a test asks for the
    calibrated one (`sim_gpus(..., fidelity="real")`), so unit tests stay fast and exact.
    """
    for var in _SIM_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ZEUS_SIM_FIDELITY", "ideal")
    zeus.device.sim.reset()
    yield
    zeus.device.sim.reset()


SimFactory = Callable[..., GPUs]


@pytest.fixture
def sim_gpus(monkeypatch: pytest.MonkeyPatch) -> SimFactory:
    """Opt in to the in-process simulated GPU and return `get_gpus()`.

    Usage: `gpus = sim_gpus("A40,V100", clock="virtual", privileged=True, visible="1,0")`.
    """

    def make(
        models: str = "A40",
        clock: str = "virtual",
        privileged: bool = True,
        visible: str | None = None,
        load: str = "idle",
        workload: str | os.PathLike[str] | None = None,
        fidelity: str = "ideal",
    ) -> GPUs:
        monkeypatch.setenv("ZEUS_GPU_BACKEND", "sim")
        monkeypatch.setenv("ZEUS_SIM_GPUS", models)
        monkeypatch.setenv("ZEUS_SIM_CLOCK", clock)
        monkeypatch.setenv("ZEUS_SIM_PRIVILEGED", "1" if privileged else "0")
        monkeypatch.setenv("ZEUS_SIM_LOAD", load)
        monkeypatch.setenv("ZEUS_SIM_FIDELITY", fidelity)
        if workload is not None:
            monkeypatch.setenv("ZEUS_SIM_WORKLOAD", os.fspath(workload))
        if visible is not None:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        zeus.device.sim.reset()
        return get_gpus()

    return make


@pytest.fixture
def shared_data() -> Path:
    """`../shared/data` beside the repository; skips the test when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data directory {SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.fixture
def fake_nvml_lib() -> Path:
    """Path of the simulated `libnvidia-ml.so.1` built with the package."""
    try:
        return zeus.device.sim.nvml_library_path()
    except FileNotFoundError as e:
        pytest.fail(str(e))
