"""zeus's AMD backend and AMD's own `amdsmi` package, both on the simulated `libamd_smi.so`.

Every test runs its checks in a fresh interpreter: the process-wide GPUs object, the loaded
libraries and the simulated boards (built by the first `amdsmi_init` from the `ZEUS_SIM_*`
variables) are per process. Each child starts from this environment without any `ZEUS_*`,
`ZEUSD_*` or ROCm/CUDA device setting, plus what the test names.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import zeus.device.sim
from childproc import run_python

# Settings that would choose another library or hide GPUs from the child.
_DROPPED_PREFIXES = ("ZEUS_", "ZEUSD_")
_DROPPED = frozenset(
    {
        "ROCM_PATH",
        "ROCM_HOME",  # amdsmi's loader reads it before ROCM_PATH
        "AMDSMI_LIB_DIR",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
    }
)

MI300X = "AMD Instinct MI300X (Simulated)"
MI250X = "AMD Instinct MI250X (Simulated)"
MI210 = "AMD Instinct MI210 (Simulated)"


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without GPU settings, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_DROPPED_PREFIXES) and k not in _DROPPED
    }
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def amd_lib() -> Path:
    """The simulated `libamd_smi.so` shipped in the package; skips when it was not built."""
    try:
        return zeus.device.sim.amdsmi_library_path()
    except FileNotFoundError as e:
        pytest.skip(f"the simulated libamd_smi.so is not built into the package: {e}")


@pytest.fixture
def rocm_dir(tmp_path: Path, amd_lib: Path) -> Path:
    """A ROCm-like tree, `DIR/lib/libamd_smi.so` linking to the simulated library."""
    (tmp_path / "rocm" / "lib").mkdir(parents=True)
    (tmp_path / "rocm" / "lib" / "libamd_smi.so").symlink_to(amd_lib)
    return tmp_path / "rocm"


def _amd(lib: Path, **extra: str) -> dict[str, str]:
    """The environment of a child whose zeus opens the AMD backend on `lib`."""
    return _env(ZEUS_GPU_BACKEND="amd", ZEUS_AMDSMI_LIB=str(lib), **extra)


# ---------------------------------------------------------------------------------------------
# 1. AMD's Python package on our library.

AMDSMI_PROBE = """
import ctypes, json, os, time, warnings
import amdsmi

LIB = os.path.join(os.environ["ROCM_PATH"], "lib", "libamd_smi.so")
out = {}
amdsmi.amdsmi_init()
# The same path again: the loader hands back the library amdsmi loaded, simulator and all.
sim = ctypes.CDLL(LIB)
out["same_library"] = sim._handle == amdsmi.amdsmi_wrapper._libraries["libamd_smi.so"]._handle
sim.zeusSimAmdTrueEnergy.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_double)]
sim.zeusSimAmdSetPower.argtypes = [ctypes.c_uint32, ctypes.c_double]

handles = amdsmi.amdsmi_get_processor_handles()
out["names"] = [amdsmi.amdsmi_get_gpu_asic_info(h)["market_name"] for h in handles]
out["bdfs"] = [amdsmi.amdsmi_get_gpu_device_bdf(h) for h in handles]
out["activity"] = amdsmi.amdsmi_get_gpu_activity(handles[0])


def truth(dies):
    # The simulator's exact energy so far, J; an MI250X's even die counts both dies'.
    total = 0.0
    for d in dies:
        j = ctypes.c_double()
        assert sim.zeusSimAmdTrueEnergy(d, ctypes.byref(j)) == 0
        total += j.value
    return total


def counter(h):
    # amdsmi's accumulator times its resolution is microjoules; J here.
    e = amdsmi.amdsmi_get_energy_count(h)
    return e["energy_accumulator"] * e["counter_resolution"] / 1e6, e["timestamp"]


def bracketed(h, dies):
    before = truth(dies)
    joules, stamp = counter(h)
    return before, joules, truth(dies), stamp


out["energy"] = {}
for name, h, dies in (("MI300X", handles[0], [0]), ("MI250X", handles[1], [1, 2])):
    a0, c0, b0, s0 = bracketed(h, dies)
    deadline = time.monotonic() + 60
    while truth(dies) - b0 < 100.0:  # 100 J: a fifth of a second busy, longer when loaded
        assert time.monotonic() < deadline, "the simulated board drew no energy"
        time.sleep(0.01)
    a1, c1, b1, s1 = bracketed(h, dies)
    # The truth over the interval lies between what had passed between the inner and outer
    # bracketing reads.
    out["energy"][name] = {"lo": a1 - b0, "hi": b1 - a0, "counted": c1 - c0, "stamps": [s0, s1]}
out["odd_die_counter"] = counter(handles[2])[0]

fields = ("current_socket_power", "average_socket_power", "power_limit")
out["busy_power"] = [
    {k: amdsmi.amdsmi_get_power_info(h)[k] for k in fields} for h in handles
]

# Powers the simulator is told to draw, then read back once a reading has caught up.
for die, watts in ((0, 321.0), (1, 150.0), (2, 100.0)):
    assert sim.zeusSimAmdSetPower(die, watts) == 0


def settled(h, key, watts):
    deadline = time.monotonic() + 30
    while True:
        got = amdsmi.amdsmi_get_power_info(h)[key]
        if isinstance(got, int) and abs(got - watts) <= 0.03 * watts:
            return got
        assert time.monotonic() < deadline, (key, got, watts)
        time.sleep(0.005)


out["set_power"] = {
    "MI300X": settled(handles[0], "current_socket_power", 321),
    # The even die reports the package: both dies' power.
    "MI250X": settled(handles[1], "average_socket_power", 250),
    "odd": amdsmi.amdsmi_get_power_info(handles[2])["average_socket_power"],
}

out["caps"] = [amdsmi.amdsmi_get_power_cap_info(h) for h in handles]
amdsmi.amdsmi_set_power_cap(handles[0], 0, 500_000_000)
out["cap_after_set"] = amdsmi.amdsmi_get_power_cap_info(handles[0])["power_cap"]
out["limit_after_set"] = amdsmi.amdsmi_get_power_info(handles[0])["power_limit"]
out["out_of_range"] = []
for uw in (900_000_000, 100_000_000):
    try:
        amdsmi.amdsmi_set_power_cap(handles[0], 0, uw)
        out["out_of_range"].append("accepted")
    except amdsmi.AmdSmiLibraryException as e:
        out["out_of_range"].append(e.get_error_code() == amdsmi.amdsmi_wrapper.AMDSMI_STATUS_INVAL)
out["cap_after_refused"] = amdsmi.amdsmi_get_power_cap_info(handles[0])["power_cap"]

# zeus's own AMD backend in this process, on the same library: it sees amdsmi's cap, and
# amdsmi sees zeus's.
os.environ["ZEUS_GPU_BACKEND"] = "amd"
os.environ["ZEUS_AMDSMI_LIB"] = LIB
import zeus.device

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the odd die's note; checked in another test
    gpus = zeus.device.get_gpus()
out["zeus_backend"] = gpus.backend
out["zeus_limit"] = gpus.get_power_management_limit(0)
gpus.set_power_management_limit(0, 600_000)
out["amdsmi_after_zeus"] = amdsmi.amdsmi_get_power_cap_info(handles[0])["power_cap"]
amdsmi.amdsmi_shut_down()
print(json.dumps(out))
"""


def test_amd_smi_python_package_on_the_simulated_library(rocm_dir: Path) -> None:
    if importlib.util.find_spec("amdsmi") is None:
        pytest.skip("AMD's amdsmi package is not installed (it is in the test extras)")
    res = run_python(
        AMDSMI_PROBE,
        _env(ROCM_PATH=str(rocm_dir), ZEUS_SIM_GPUS="MI300X,MI250X", ZEUS_SIM_LOAD="busy"),
    )
    assert res["same_library"] is True
    assert res["names"] == [MI300X, MI250X, MI250X]
    assert res["bdfs"] == ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
    assert res["activity"]["gfx_activity"] == 100 and res["activity"]["umc_activity"] == 35

    for name, e in res["energy"].items():
        assert e["lo"] >= 100.0, (name, e)
        # Within 3% of the truth the reads bracketed (the counter publishes every ms).
        assert 0.97 * e["lo"] <= e["counted"] <= 1.03 * e["hi"], (name, e)
        assert e["stamps"][1] > e["stamps"][0], (name, e)
    assert res["odd_die_counter"] == 0

    mi300x, even, odd = res["busy_power"]
    assert isinstance(mi300x["current_socket_power"], int) and mi300x["current_socket_power"] > 0
    assert mi300x["average_socket_power"] == "N/A"
    assert isinstance(even["average_socket_power"], int) and even["average_socket_power"] > 0
    assert even["current_socket_power"] == "N/A"
    assert odd["average_socket_power"] == 0
    assert [p["power_limit"] for p in res["busy_power"]] == [750, 280, 280]
    assert abs(res["set_power"]["MI300X"] - 321) <= 0.03 * 321
    assert abs(res["set_power"]["MI250X"] - 250) <= 0.03 * 250
    assert res["set_power"]["odd"] == 0

    caps = [
        {k: c[k] for k in ("power_cap", "default_power_cap", "min_power_cap", "max_power_cap")}
        for c in res["caps"]
    ]
    assert caps[0] == {
        "power_cap": 750_000_000,
        "default_power_cap": 750_000_000,
        "min_power_cap": 200_000_000,
        "max_power_cap": 750_000_000,
    }
    assert (
        caps[1]
        == caps[2]
        == {
            "power_cap": 280_000_000,
            "default_power_cap": 280_000_000,
            "min_power_cap": 100_000_000,
            "max_power_cap": 280_000_000,
        }
    )
    assert res["cap_after_set"] == 500_000_000
    assert res["limit_after_set"] == 500
    assert res["out_of_range"] == [True, True]  # AmdSmiLibraryException, AMDSMI_STATUS_INVAL
    assert res["cap_after_refused"] == 500_000_000
    assert res["zeus_backend"] == "amd"
    assert res["zeus_limit"] == 500_000
    assert res["amdsmi_after_zeus"] == 600_000_000


# ---------------------------------------------------------------------------------------------
# 2. zeus's AMD backend.

ZEUS_AMD_PROBE = """
import json, warnings
import zeus.device
from zeus.device import ZeusGPUInvalidArgError, ZeusGPUNoPermissionError
from zeus.device.gpu import GPUs
from zeus.device.gpu.amd import AMDGPUs, amdsmi_is_available

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    gpus = zeus.device.get_gpus()
n = len(gpus)
out = {
    "backend": gpus.backend,
    "names": [gpus.get_name(i) for i in range(n)],
    "vendors": [gpus.get_vendor(i) for i in range(n)],
    "counters": [gpus.supports_get_total_energy_consumption(i) for i in range(n)],
    "notes": gpus.notes,
    "warnings": [[w.category.__name__, str(w.message)] for w in caught],
    "amdsmi_is_available": amdsmi_is_available(),
    "amdgpus_is_gpus": AMDGPUs is GPUs and isinstance(gpus, AMDGPUs),
    "limit": gpus.get_power_management_limit(0),
    "constraints": list(gpus.get_power_management_limit_constraints(0)),
}
try:
    gpus.set_power_management_limit(0, 400_000)
    out["after_set"] = gpus.get_power_management_limit(0)
except ZeusGPUNoPermissionError as e:
    out["set_error"] = ["ZeusGPUNoPermissionError", str(e)]
try:
    gpus.set_power_management_limit(0, 100_000)
except ZeusGPUInvalidArgError as e:
    out["out_of_range"] = ["ZeusGPUInvalidArgError", str(e)]
out["after_refused"] = gpus.get_power_management_limit(0)
print(json.dumps(out))
"""


def test_zeus_amd_backend_names_vendor_notes_and_power_limits(amd_lib: Path) -> None:
    res = run_python(ZEUS_AMD_PROBE, _amd(amd_lib, ZEUS_SIM_GPUS="MI300X,MI250X"))
    assert res["backend"] == "amd"
    assert res["names"] == [MI300X, MI250X, MI250X]
    assert res["vendors"] == ["amd", "amd", "amd"]
    assert res["amdsmi_is_available"] is True
    assert res["amdgpus_is_gpus"] is True
    # The odd die reports 0 W, so its counter is disabled when the GPUs are opened; the
    # note is in `.notes` and was warned, once.
    assert res["counters"] == [True, True, False]
    [note] = res["notes"]
    assert note.startswith(f"GPU 2 ({MI250X}): energy counter disabled"), note
    assert "odd die of an MI250X reports 0 W" in note, note
    assert res["warnings"] == [["UserWarning", note]]

    assert res["limit"] == 750_000 and res["constraints"] == [200_000, 750_000]
    assert res["after_set"] == 400_000
    kind, message = res["out_of_range"]
    assert kind == "ZeusGPUInvalidArgError"
    assert "100000" in message and "[200000, 750000]" in message, message
    assert res["after_refused"] == 400_000


def test_zeus_amd_backend_unprivileged_cannot_set_the_power_limit(amd_lib: Path) -> None:
    res = run_python(ZEUS_AMD_PROBE, _amd(amd_lib, ZEUS_SIM_GPUS="MI300X", ZEUS_SIM_PRIVILEGED="0"))
    assert res["backend"] == "amd" and res["notes"] == [] and res["warnings"] == []
    kind, message = res["set_error"]
    assert kind == "ZeusGPUNoPermissionError"
    assert "NO_PERM" in message, message
    assert res["after_refused"] == 750_000  # nothing changed


# ---------------------------------------------------------------------------------------------
# 3. and 4. Visible devices and HIP's order.

VISIBLE_PROBE = """
import json
import zeus.device
try:
    gpus = zeus.device.get_gpus()
except zeus.device.ZeusBaseGPUError as e:
    print(json.dumps({"error": [type(e).__name__, str(e)]}))
else:
    print(json.dumps({
        "backend": gpus.backend,
        "physical": gpus.physical_indices,
        "names": [gpus.get_name(i) for i in range(len(gpus))],
        "uuids": [gpus.get_uuid(i) for i in range(len(gpus))],
    }))
"""

THREE = "MI300X,MI210,MI300X"
THREE_NAMES = [MI300X, MI210, MI300X]


@pytest.fixture(scope="module")
def all_three(amd_lib: Path) -> dict:
    """Every GPU of `THREE` with no visibility setting: index -> uuid, in HIP order."""
    res = run_python(VISIBLE_PROBE, _amd(amd_lib, ZEUS_SIM_GPUS=THREE))
    assert res["physical"] == [0, 1, 2] and res["names"] == THREE_NAMES
    assert len(set(res["uuids"])) == 3
    return res


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ({"HIP_VISIBLE_DEVICES": "2,0"}, [2, 0]),
        ({"ROCR_VISIBLE_DEVICES": "1,2"}, [1, 2]),
        # HIP's indices count what ROCr left: its 1 is the backend's 2.
        ({"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "1"}, [2]),
        ({"CUDA_VISIBLE_DEVICES": "1"}, [1]),
        ({"CUDA_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "2"}, [2]),  # HIP's wins
        ({"ROCR_VISIBLE_DEVICES": "2,0", "CUDA_VISIBLE_DEVICES": "1"}, [0]),
    ],
    ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else None,
)
def test_visible_devices_pick_and_order_gpus(
    amd_lib: Path, all_three: dict, visible: dict[str, str], expected: list[int]
) -> None:
    res = run_python(VISIBLE_PROBE, _amd(amd_lib, ZEUS_SIM_GPUS=THREE, **visible))
    assert res["backend"] == "amd"
    assert res["physical"] == expected
    assert res["uuids"] == [all_three["uuids"][i] for i in expected]
    assert res["names"] == [THREE_NAMES[i] for i in expected]


def test_visible_devices_by_uuid(amd_lib: Path, all_three: dict) -> None:
    uuid = all_three["uuids"][2]
    res = run_python(VISIBLE_PROBE, _amd(amd_lib, ZEUS_SIM_GPUS=THREE, HIP_VISIBLE_DEVICES=uuid))
    assert res["physical"] == [2] and res["uuids"] == [uuid]


@pytest.mark.parametrize(
    ("visible", "named"),
    [
        ({"HIP_VISIBLE_DEVICES": "5"}, "HIP_VISIBLE_DEVICES"),
        ({"HIP_VISIBLE_DEVICES": "x"}, "HIP_VISIBLE_DEVICES"),
        ({"HIP_VISIBLE_DEVICES": ""}, "HIP_VISIBLE_DEVICES"),
        ({"ROCR_VISIBLE_DEVICES": "0,0"}, "ROCR_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": "7"}, "CUDA_VISIBLE_DEVICES"),
        # Two GPUs are left after ROCr's, so HIP's 2 is out of range.
        ({"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "2"}, "HIP_VISIBLE_DEVICES"),
    ],
    ids=lambda v: ",".join(f"{k}={x!r}" for k, x in v.items()) if isinstance(v, dict) else None,
)
def test_bad_visible_devices_name_the_variable(
    amd_lib: Path, visible: dict[str, str], named: str
) -> None:
    res = run_python(VISIBLE_PROBE, _amd(amd_lib, ZEUS_SIM_GPUS=THREE, **visible))
    kind, message = res["error"]
    assert kind == "ZeusGPUInvalidArgError"
    assert named in message, message


def test_gpus_come_in_hip_order_not_amdsmi_order(amd_lib: Path) -> None:
    pci = run_python(VISIBLE_PROBE, _amd(amd_lib, ZEUS_SIM_GPUS="MI300X,MI210"))
    hip = run_python(
        VISIBLE_PROBE,
        _amd(amd_lib, ZEUS_SIM_GPUS="MI300X,MI210", ZEUS_SIM_AMD_HIP_ORDER="reversed"),
    )
    assert pci["names"] == [MI300X, MI210]
    assert hip["names"] == [MI210, MI300X]
    assert hip["uuids"] == pci["uuids"][::-1]
    # HIP_VISIBLE_DEVICES counts in HIP's order too.
    first = run_python(
        VISIBLE_PROBE,
        _amd(
            amd_lib,
            ZEUS_SIM_GPUS="MI300X,MI210",
            ZEUS_SIM_AMD_HIP_ORDER="reversed",
            HIP_VISIBLE_DEVICES="0",
        ),
    )
    assert first["names"] == [MI210] and first["uuids"] == [pci["uuids"][1]]


# ---------------------------------------------------------------------------------------------
# 5. Which library, and what is said when none loads.

BACKEND_PROBE = """
import json
import zeus.device
from zeus.device.gpu.amd import amdsmi_is_available
try:
    gpus = zeus.device.get_gpus()
except zeus.device.ZeusBaseGPUError as e:
    out = {"error": [type(e).__name__, str(e)]}
else:
    out = {"backend": gpus.backend, "names": [gpus.get_name(i) for i in range(len(gpus))]}
out["amdsmi_is_available"] = amdsmi_is_available()
print(json.dumps(out))
"""


def test_amd_backend_with_a_missing_library_says_how_to_go_on(tmp_path: Path) -> None:
    env = _env(ZEUS_GPU_BACKEND="amd", ZEUS_AMDSMI_LIB=str(tmp_path / "nope.so"))
    res = run_python(BACKEND_PROBE, env)
    kind, message = res["error"]
    assert kind == "ZeusGPULibraryNotFoundError"
    for part in ("nope.so", "ZEUS_GPU_BACKEND=sim", "ZEUS_AMDSMI_LIB"):
        assert part in message, (part, message)
    assert res["amdsmi_is_available"] is False


def test_auto_falls_back_to_amd_when_nvml_cannot_load(tmp_path: Path, amd_lib: Path) -> None:
    env = _env(
        ZEUS_NVML_LIB=str(tmp_path / "none.so"), ZEUS_AMDSMI_LIB=str(amd_lib), ZEUS_SIM_GPUS="MI210"
    )
    res = run_python(BACKEND_PROBE, env)
    assert res["backend"] == "amd" and res["names"] == [MI210]
    assert res["amdsmi_is_available"] is True


def test_auto_with_neither_library_names_both(tmp_path: Path) -> None:
    env = _env(ZEUS_NVML_LIB=str(tmp_path / "none.so"), ZEUS_AMDSMI_LIB=str(tmp_path / "nope.so"))
    res = run_python(BACKEND_PROBE, env)
    kind, message = res["error"]
    assert kind == "ZeusGPULibraryNotFoundError"
    for part in ("NVML", "AMD SMI", "none.so", "nope.so", "ZEUS_GPU_BACKEND=sim"):
        assert part in message, (part, message)
    assert res["amdsmi_is_available"] is False


def test_explicit_nvml_does_not_fall_back_to_amd(tmp_path: Path, amd_lib: Path) -> None:
    env = _env(
        ZEUS_GPU_BACKEND="nvml",
        ZEUS_NVML_LIB=str(tmp_path / "none.so"),
        ZEUS_AMDSMI_LIB=str(amd_lib),
        ZEUS_SIM_GPUS="MI210",
    )
    res = run_python(BACKEND_PROBE, env)
    kind, message = res["error"]
    assert kind == "ZeusGPULibraryNotFoundError" and "none.so" in message, message


def test_auto_with_both_simulated_libraries_takes_each_vendors_gpus(amd_lib: Path) -> None:
    nvml = zeus.device.sim.nvml_library_path()
    libs = {"ZEUS_NVML_LIB": str(nvml), "ZEUS_AMDSMI_LIB": str(amd_lib)}
    amd_only = run_python(BACKEND_PROBE, _env(ZEUS_SIM_GPUS="MI300X", **libs))
    mixed = run_python(BACKEND_PROBE, _env(ZEUS_SIM_GPUS="A40,MI300X", **libs))
    # NVML has no GPUs: AMD SMI's are taken. NVML has one: only it.
    assert amd_only.get("backend") == "amd", amd_only
    assert mixed == {
        "backend": "nvml",
        "names": ["NVIDIA A40 (Simulated)"],
        "amdsmi_is_available": False,
    }


# ---------------------------------------------------------------------------------------------
# 6. The in-process simulator with AMD models.

SIM_PROBE = """
import json, warnings
import zeus.device
from zeus.device.gpu.amd import amdsmi_is_available
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    gpus = zeus.device.get_gpus()
print(json.dumps({
    "backend": gpus.backend,
    "vendor": gpus.get_vendor(0),
    "name": gpus.get_name(0),
    "virtual": gpus.virtual_clock,
    "counter": gpus.supports_get_total_energy_consumption(0),
    "notes": gpus.notes,
    "warnings": [str(w.message) for w in caught],
    "amdsmi_is_available": amdsmi_is_available(),
}))
"""


def test_simulator_with_an_amd_model_is_amd_but_not_amd_smi() -> None:
    res = run_python(
        SIM_PROBE, _env(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="MI300X", ZEUS_SIM_CLOCK="real")
    )
    assert res["backend"] == "sim" and res["vendor"] == "amd" and res["name"] == MI300X
    assert res["amdsmi_is_available"] is False
    assert res["counter"] is True and res["notes"] == [] and res["warnings"] == []


def test_simulator_counter_counting_a_fifteenth_is_disabled_with_a_warning() -> None:
    # The MI210 bug: the counter counted 1/15 of the energy.
    env = _env(
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS="MI300X",
        ZEUS_SIM_CLOCK="real",
        ZEUS_SIM_COUNTER_SCALE="0.066",
    )
    res = run_python(SIM_PROBE, env)
    assert res["virtual"] is False  # the check waits half a second on the real clock
    assert res["counter"] is False
    [note] = res["notes"]
    assert res["warnings"] == [note]
    assert note.startswith(f"GPU 0 ({MI300X}): energy counter disabled, energy comes from "), note
    m = re.search(r"\(([0-9.]+)×, outside 0\.1-10×\)", note)
    assert m, note
    assert 0.05 < float(m.group(1)) < 0.08, note


# ---------------------------------------------------------------------------------------------
# 7. Where the simulated library is.


def test_amdsmi_path_command_prints_the_bundled_library(amd_lib: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "zeus.device.sim", "amdsmi-path"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    printed = Path(out.stdout.strip())
    assert printed.is_absolute() and printed.is_file(), out.stdout
    assert printed.name == "libamd_smi.so"
    assert printed.samefile(amd_lib)


# ---------------------------------------------------------------------------------------------
# `python -m zeus.show_env` on AMD.


def _show_env(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zeus.show_env"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_show_env_names_amd_smi_the_vendors_and_the_notes(amd_lib: Path, rocm_dir: Path) -> None:
    link = rocm_dir / "lib" / "libamd_smi.so"
    out = _show_env(_amd(link, ZEUS_SIM_GPUS="MI250X,MI300X", HIP_VISIBLE_DEVICES="2,0,1"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "HIP_VISIBLE_DEVICES=2,0,1" in lines, out.stdout
    assert "GPU backend: amd (3 visible)" in lines, out.stdout
    # The file the loader opened, the link followed.
    assert f"GPU library: AMD SMI ({amd_lib.resolve()})" in lines, out.stdout
    gpu_lines = [x for x in lines if re.match(r"  GPU \d+: ", x)]
    assert len(gpu_lines) == 3, out.stdout
    assert gpu_lines[0].startswith(f"  GPU 0: {MI300X}, cdna3, vendor amd, power limit 750 W")
    assert gpu_lines[0].endswith(", energy counter"), gpu_lines[0]
    assert gpu_lines[1].startswith(f"  GPU 1: {MI250X}, cdna2, vendor amd, power limit 280 W")
    assert gpu_lines[1].endswith(", energy counter"), gpu_lines[1]
    assert gpu_lines[2].startswith(f"  GPU 2: {MI250X}, cdna2, vendor amd, ")
    assert gpu_lines[2].endswith(", no counter"), gpu_lines[2]
    notes = lines[lines.index("GPU notes:") + 1 :]
    # The odd die is backend GPU 1 and visible GPU 2: notes number GPUs as the process does.
    assert len(notes) == 1, out.stdout
    assert re.match(rf"  GPU 2 \({re.escape(MI250X)}\): energy counter disabled", notes[0])
    assert "odd die of an MI250X reports 0 W" in notes[0]
    assert "energy counter disabled" not in out.stderr  # printed once, not warned as well


def test_notes_number_gpus_as_the_process_sees_them(amd_lib: Path) -> None:
    code = """
import json, warnings
import zeus.device
warnings.simplefilter("ignore")
g = zeus.device.get_gpus()
print(json.dumps({"n": len(g), "notes": g.notes}))
"""
    # The odd die (backend GPU 1) is visible GPU 0.
    reordered = run_python(code, _amd(amd_lib, ZEUS_SIM_GPUS="MI250X", HIP_VISIBLE_DEVICES="1,0"))
    assert reordered["n"] == 2
    assert [n.split(" (")[0] for n in reordered["notes"]] == ["GPU 0"], reordered
    # The odd die is hidden: there is nothing to note about the one GPU this process has.
    hidden = run_python(code, _amd(amd_lib, ZEUS_SIM_GPUS="MI300X,MI250X", HIP_VISIBLE_DEVICES="0"))
    assert hidden == {"n": 1, "notes": []}


def test_show_env_on_the_simulator_names_vendors_and_no_library() -> None:
    out = _show_env(_env(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="A40,MI210"))
    assert out.returncode == 0, out.stderr
    assert "GPU backend: sim (2 visible)" in out.stdout
    assert "  GPU 0: NVIDIA A40 (Simulated), ampere, vendor nvidia, " in out.stdout
    assert f"  GPU 1: {MI210}, cdna2, vendor amd, " in out.stdout
    assert "GPU library:" not in out.stdout and "GPU notes:" not in out.stdout


def test_show_env_without_gpus_still_reports(tmp_path: Path) -> None:
    out = _show_env(_env(ZEUS_GPU_BACKEND="amd", ZEUS_AMDSMI_LIB=str(tmp_path / "nope.so")))
    assert out.returncode == 0, out.stderr
    assert "GPUs: none available (" in out.stdout and "nope.so" in out.stdout
    assert "GPU backend:" not in out.stdout


def test_the_power_is_whichever_reading_the_board_has(amd_lib: Path) -> None:
    """`get_power_usage` (what the CLI and the demo show): the average where the board has
    one (MI250X), else the instant power (MI300X has no average)."""
    code = """
import json
import zeus.device
from zeus.device.exception import ZeusGPUNotSupportedError
g = zeus.device.get_gpus()
out = {}
for i in range(len(g)):
    try:
        avg = g.get_average_power_usage(i)
    except ZeusGPUNotSupportedError:
        avg = None
    try:
        inst = g.get_instant_power_usage(i)
    except ZeusGPUNotSupportedError:
        inst = None
    out[i] = [avg, inst, g.get_power_usage(i)]
print(json.dumps(out))
"""
    res = run_python(code, _amd(amd_lib, ZEUS_SIM_GPUS="MI300X,MI210", ZEUS_SIM_LOAD="busy"))
    mi300x, mi210 = res["0"], res["1"]
    assert mi300x[0] is None and mi300x[1] > 140_000, mi300x
    assert abs(mi300x[2] - mi300x[1]) <= 0.05 * mi300x[1], mi300x
    assert mi210[1] is None and mi210[0] > 40_000, mi210
    assert abs(mi210[2] - mi210[0]) <= 0.05 * mi210[0], mi210
