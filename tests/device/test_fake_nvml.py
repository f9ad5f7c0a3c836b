"""The simulated libnvidia-ml.so.1: NVIDIA's own Python bindings and zeus's NVML backend on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _run(code: str, lib: Path, **env: str) -> dict:
    """Run `code` in a fresh interpreter with the fake library on the loader path."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "CUDA_"))}
    full["LD_LIBRARY_PATH"] = f"{lib.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


PYNVML_PROBE = """
import json, time, pynvml
pynvml.nvmlInit()
n = pynvml.nvmlDeviceGetCount()
res = {"count": n, "devices": []}
for i in range(n):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    d = {"name": pynvml.nvmlDeviceGetName(h),
         "constraints": list(pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)),
         "power": pynvml.nvmlDeviceGetPowerUsage(h)}
    try:
        e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
        time.sleep(0.25)  # longer than an update period, at either fidelity
        d["energy_delta"] = pynvml.nvmlDeviceGetTotalEnergyConsumption(h) - e0
    except pynvml.NVMLError as err:
        d["energy_error"] = err.value
        d["energy_error_is_not_supported"] = isinstance(err, pynvml.NVMLError_NotSupported)
    try:
        pynvml.nvmlDeviceSetPowerManagementLimit(h, d["constraints"][0])
        d["set_ok"] = pynvml.nvmlDeviceGetPowerManagementLimit(h) == d["constraints"][0]
    except pynvml.NVMLError as err:
        d["set_error"] = err.value
    res["devices"].append(d)
pynvml.nvmlShutdown()
print(json.dumps(res))
"""


def test_nvidia_ml_py_on_the_simulated_library(fake_nvml_lib):
    pytest.importorskip("pynvml")
    res = _run(PYNVML_PROBE, fake_nvml_lib, ZEUS_SIM_GPUS="A40,P100", ZEUS_SIM_LOAD="busy")
    assert res["count"] == 2
    a40, p100 = res["devices"]
    assert a40["name"] == "NVIDIA A40 (Simulated)"
    assert a40["constraints"] == [100_000, 300_000]
    assert a40["energy_delta"] > 0
    assert 30_000 < a40["power"] <= 300_000
    assert a40["set_ok"] is True
    assert "P100" in p100["name"]
    assert p100["energy_error"] == 3  # NVML_ERROR_NOT_SUPPORTED
    assert p100["energy_error_is_not_supported"] is True


def test_nvidia_ml_py_sees_no_permission_when_unprivileged(fake_nvml_lib):
    pytest.importorskip("pynvml")
    res = _run(PYNVML_PROBE, fake_nvml_lib, ZEUS_SIM_GPUS="V100", ZEUS_SIM_PRIVILEGED="0")
    assert res["devices"][0]["set_error"] == 4  # NVML_ERROR_NO_PERMISSION


ZEUS_PROBE = """
import json, time
from zeus.device import get_gpus, ZeusGPUNotSupportedError, ZeusGPUInvalidArgError
g = get_gpus()
out = {"backend": g.backend, "names": [g.get_name(i) for i in range(len(g))]}
e0 = g.get_total_energy_consumption(0)
time.sleep(0.25)  # longer than an update period, at either fidelity
out["delta"] = g.get_total_energy_consumption(0) - e0
g.set_power_management_limit(0, 200_000)
out["pl"] = g.get_power_management_limit(0)
try:
    g.set_power_management_limit(0, 1)
except ZeusGPUInvalidArgError as e:
    out["invalid"] = str(e)
try:
    g.get_total_energy_consumption(1)
except ZeusGPUNotSupportedError:
    out["p100"] = "not supported"
out["clocks"] = g.get_supported_graphics_clocks(0)[:2]
print(json.dumps(out))
"""


@pytest.mark.parametrize("how", ["ZEUS_NVML_LIB", "LD_LIBRARY_PATH"])
def test_zeus_nvml_backend_on_the_simulated_library(fake_nvml_lib, how):
    extra = {"ZEUS_SIM_GPUS": "A40,P100", "ZEUS_SIM_LOAD": "busy", "CUDA_VISIBLE_DEVICES": "0,1"}
    if how == "ZEUS_NVML_LIB":
        extra["ZEUS_NVML_LIB"] = str(fake_nvml_lib)
    res = _run(ZEUS_PROBE, fake_nvml_lib, **extra)
    assert res["backend"] == "nvml"
    assert res["names"][0] == "NVIDIA A40 (Simulated)"
    assert res["delta"] > 0
    assert res["pl"] == 200_000
    assert "1 mW" in res["invalid"]
    assert res["p100"] == "not supported"
    assert res["clocks"] == [1740, 1725]
