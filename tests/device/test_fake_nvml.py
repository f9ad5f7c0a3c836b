"""The simulated libnvidia-ml.so.1: NVIDIA's own Python bindings and zeus's NVML backend on it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from childproc import run_python


def _run(code: str, lib: Path, **env: str) -> dict:
    """Run `code` in a fresh interpreter with the fake library on the loader path."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "CUDA_"))}
    full["LD_LIBRARY_PATH"] = f"{lib.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    full.update(env)
    return run_python(code, full)


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


def test_every_documented_function_is_exported(fake_nvml_lib):
    """docs/simulated-nvml.md lists what the library exports; keep the two equal."""
    import ctypes
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "simulated-nvml.md").read_text()
    names = set(re.findall(r"\b((?:nvml|zeusSim)[A-Za-z]+(?:_v\d)?)\b", doc))
    # `Foo(_v2, _v3)` lists three functions.
    for base, suffixes in re.findall(r"\b(nvml[A-Za-z]+)\(((?:_v\d(?:, )?)+)\)", doc):
        names.update(base + s.strip() for s in suffixes.split(","))
    lib = ctypes.CDLL(str(fake_nvml_lib))
    missing = sorted(n for n in names if not hasattr(lib, n))
    assert len(names) > 70
    assert missing == []


NVML_READER_PROBE = """
import json, pynvml
pynvml.nvmlInit()
out = {
    "driver": pynvml.nvmlSystemGetDriverVersion(),
    "nvml": pynvml.nvmlSystemGetNVMLVersion(),
    "cuda": pynvml.nvmlSystemGetCudaDriverVersion(),
    "devices": [],
}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    mem2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    pci = pynvml.nvmlDeviceGetPciInfo(h)
    d = {
        "name": pynvml.nvmlDeviceGetName(h),
        "temp": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "slowdown": pynvml.nvmlDeviceGetTemperatureThreshold(
            h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "mem": [mem.total, mem.used, mem.free],
        "mem2": [mem2.total, mem2.used, mem2.free, mem2.reserved],
        "util": [util.gpu, util.memory],
        "pci": [pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId,
                pci.pciDeviceId],
        "sm": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "max_mem_clock": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
        "pstate": pynvml.nvmlDeviceGetPerformanceState(h),
        "procs": len(pynvml.nvmlDeviceGetComputeRunningProcesses(h))
        + len(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)),
        "serial": pynvml.nvmlDeviceGetSerial(h),
        "minor": pynvml.nvmlDeviceGetMinorNumber(h),
        "brand": pynvml.nvmlDeviceGetBrand(h),
        "reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        "pcie": [pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                 pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)],
        "enforced": pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
        "compute_mode": pynvml.nvmlDeviceGetComputeMode(h),
    }
    try:
        pynvml.nvmlDeviceGetFanSpeed(h)
        d["fan"] = "read"
    except pynvml.NVMLError_NotSupported:
        d["fan"] = "not supported"
    out["devices"].append(d)
pynvml.nvmlShutdown()
print(json.dumps(out))
"""


def test_nvidia_smi_like_queries_succeed(fake_nvml_lib):
    """What nvidia-smi-like readers (nvitop, gpustat, plain nvidia-ml-py scripts) ask."""
    pytest.importorskip("pynvml")
    res = _run(
        NVML_READER_PROBE,
        fake_nvml_lib,
        ZEUS_SIM_GPUS="H100,A40",
        ZEUS_SIM_LOAD="busy",
        ZEUS_SIM_FIDELITY="ideal",
    )
    assert "zeus-sim" in res["driver"] and res["cuda"] > 0
    h100, a40 = res["devices"]
    assert h100["name"] == "NVIDIA H100 80GB HBM3 (Simulated)"
    assert 30 < h100["temp"] <= 80 and h100["slowdown"] > h100["temp"]
    total, used, free = h100["mem"]
    assert total == 81559 << 20 and used + free == total and used > 0
    assert h100["mem2"][0] == total and sum(h100["mem2"][1:]) == total
    assert h100["util"] == [100, 35]
    assert h100["pci"] == ["00000000:01:00.0", 0x233010DE]
    assert a40["pci"][0] == "00000000:02:00.0"
    assert h100["sm"] == 1980 and h100["max_mem_clock"] == 2619
    assert h100["pstate"] == 0 and h100["procs"] == 0 and h100["reasons"] == 0
    assert h100["minor"] == 0 and a40["minor"] == 1 and h100["brand"] == 14
    assert len(h100["serial"]) == 13 and h100["serial"].isdigit()
    assert h100["pcie"] == [5, 16] and a40["pcie"] == [4, 16]
    assert h100["enforced"] == 700_000 and h100["compute_mode"] == 0
    assert h100["fan"] == "not supported"


SET_POWER_PROBE = """
import ctypes, json, os
lib = ctypes.CDLL(os.environ["ZEUS_NVML_LIB"])
lib.zeusSimSetPower.argtypes = [ctypes.c_uint, ctypes.c_double]
lib.zeusSimAdvance.argtypes = [ctypes.c_double]
out = {"before_init": lib.zeusSimSetPower(0, 100.0)}
assert lib.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0

def truth():
    x = ctypes.c_double()
    assert lib.zeusSimTrueEnergy(0, ctypes.byref(x)) == 0
    return x.value

def counter():
    mj = ctypes.c_ulonglong()
    assert lib.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(mj)) == 0
    return mj.value

def power():
    mw = ctypes.c_uint()
    assert lib.nvmlDeviceGetPowerUsage(h, ctypes.byref(mw)) == 0
    return mw.value

out["set"] = lib.zeusSimSetPower(0, 123.0)
e0, c0 = truth(), counter()
assert lib.zeusSimAdvance(2.0) == 0
out["truth"], out["counted"], out["power"] = truth() - e0, counter() - c0, power()
out["above_limit"] = [lib.zeusSimSetPower(0, 1000.0), power()]
out["bad"] = [lib.zeusSimSetPower(0, w) for w in (-1.0, float("nan"), float("inf"))]
out["bad_index"] = lib.zeusSimSetPower(7, 100.0)
out["after_bad"] = power()
print(json.dumps(out))
"""


def test_zeus_sim_set_power_through_the_c_abi(fake_nvml_lib):
    res = _run(
        SET_POWER_PROBE,
        fake_nvml_lib,
        ZEUS_NVML_LIB=str(fake_nvml_lib),
        ZEUS_SIM_GPUS="A40",
        ZEUS_SIM_CLOCK="virtual",
        ZEUS_SIM_FIDELITY="ideal",
    )
    assert res["before_init"] == 1  # NVML_ERROR_UNINITIALIZED
    assert res["set"] == 0
    assert abs(res["truth"] - 246.0) < 1e-9  # 123 W for 2 s
    assert abs(res["counted"] - 246_000) <= 1  # the counter in whole mJ
    # The average power reading carries the board's 1% reading noise.
    assert res["power"] == pytest.approx(123_000, rel=0.0101)
    assert res["above_limit"][0] == 0
    assert res["above_limit"][1] == pytest.approx(300_000, rel=0.0101)  # the A40's limit
    assert res["bad"] == [2, 2, 2]  # NVML_ERROR_INVALID_ARGUMENT
    assert res["bad_index"] == 2
    assert res["after_bad"] == res["above_limit"][1]  # nothing changed, same update period
