"""`ZEUS_SIM_SHARED`: one simulated GPU seen by several processes, as a real GPU is.

Process A (a subprocess, privileged) changes the settings; process B (this test process,
unprivileged) cannot, but sees what A set, through zeus and through NVIDIA's own bindings
loading the simulated `libnvidia-ml.so.1`; and both count the same energy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zeus.device.sim
from childproc import run_python
from zeus.device import get_gpus
from zeus.device.exception import ZeusGPUNoPermissionError

GPUS = "A100,H100"


def _env(shared: Path, privileged: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "CUDA_"))}
    env.update(
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS=GPUS,
        ZEUS_SIM_SHARED=str(shared),
        ZEUS_SIM_PRIVILEGED="1" if privileged else "0",
        ZEUS_SIM_FIDELITY="ideal",
    )
    env.update(extra)
    return env


def _run(code: str, env: dict[str, str]) -> dict:
    return run_python(code, env)


PROCESS_A = """
import json
import zeus.device.sim as sim
from zeus.device import get_gpus
gpus = get_gpus()
gpus.set_power_management_limit(1, 500_000)
gpus.set_gpu_locked_clocks(1, 1200, 1200)
gpus.set_memory_locked_clocks(0, 1215, 1215)
sim.set_busy(1, True)
print(json.dumps({
    "steady": [list(sim.steady_state(i)) for i in range(2)],
    "energy": gpus.get_total_energy_consumption(1),
    "now": sim.now(),
}))
"""

PYNVML_B = """
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(1)
res = {"limit": pynvml.nvmlDeviceGetPowerManagementLimit(h),
       "energy": pynvml.nvmlDeviceGetTotalEnergyConsumption(h)}
try:
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    res["set"] = "ok"
except pynvml.NVMLError_NoPermission:
    res["set"] = "no permission"
pynvml.nvmlShutdown()
print(json.dumps(res))
"""


def test_a_privileged_process_sets_and_an_unprivileged_one_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_nvml_lib: Path
) -> None:
    shared = tmp_path / "gpus"
    a = _run(PROCESS_A, _env(shared, privileged=True))

    # Process B: this one, unprivileged, on the same file.
    for k, v in _env(shared, privileged=False).items():
        if k.startswith("ZEUS_"):
            monkeypatch.setenv(k, v)
    zeus.device.sim.reset()
    gpus = get_gpus()
    assert gpus.get_power_management_limit(1) == 500_000
    assert gpus.get_power_management_limit(0) == 400_000  # A left the A100's limit alone
    # Locked clocks change the busy steady state; B computes it from the shared settings.
    assert [list(zeus.device.sim.steady_state(i)) for i in range(2)] == a["steady"]
    assert zeus.device.sim.is_busy(1) and not zeus.device.sim.is_busy(0)
    with pytest.raises(ZeusGPUNoPermissionError):
        gpus.set_power_management_limit(1, 300_000)
    with pytest.raises(ZeusGPUNoPermissionError):
        gpus.set_gpu_locked_clocks(1, 800, 800)
    with pytest.raises(ZeusGPUNoPermissionError):
        gpus.set_memory_locked_clocks(0, 1215, 1215)
    assert gpus.get_power_management_limit(1) == 500_000

    # The energy counter kept counting A's busy GPU after A exited.
    busy_w = zeus.device.sim.true_power(1)
    assert busy_w == pytest.approx(a["steady"][1][1])
    e_b, t_b = gpus.get_total_energy_consumption(1), zeus.device.sim.now()
    want_mj = busy_w * (t_b - a["now"]) * 1000
    assert e_b - a["energy"] == pytest.approx(want_mj, rel=0.02, abs=busy_w * 2)

    # The other face: NVIDIA's bindings on the simulated library, unprivileged, read the same
    # limit and a counter between two of B's readings taken around it.
    pytest.importorskip("pynvml")
    env = _env(shared, privileged=False)
    env["LD_LIBRARY_PATH"] = f"{fake_nvml_lib.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    before = gpus.get_total_energy_consumption(1)
    n = _run(PYNVML_B, env)
    after = gpus.get_total_energy_consumption(1)
    assert n["limit"] == 500_000
    assert n["set"] == "no permission"
    assert before <= n["energy"] <= after


def test_energy_read_at_the_same_moment_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two processes read the counter at once (a barrier on a pipe): the readings agree."""
    shared = tmp_path / "gpus"
    code = """
import json, sys
from zeus.device import get_gpus
gpus = get_gpus()
gpus.get_total_energy_consumption(1)  # attached
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps({"energy": gpus.get_total_energy_consumption(1)}), flush=True)
"""
    env = _env(shared, privileged=True, ZEUS_SIM_LOAD="busy", ZEUS_SIM_FIDELITY="real")
    env["ZEUS_SIM_ENERGY_READ_MS"] = "0"
    for k, v in env.items():
        if k.startswith("ZEUS_"):
            monkeypatch.setenv(k, v)
    zeus.device.sim.reset()
    gpus = get_gpus()
    agreed = 0
    for _ in range(5):
        p = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert p.stdin is not None and p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        # At real fidelity the counter changes once per update period (100 ms on an H100):
        # reads a few hundred microseconds apart agree unless an update falls between them.
        before = gpus.get_total_energy_consumption(1)
        p.stdin.write("\n")
        p.stdin.flush()
        theirs = json.loads(p.stdout.readline())["energy"]
        after = gpus.get_total_energy_consumption(1)
        assert p.wait(timeout=60) == 0
        assert before <= theirs <= after
        agreed += before == theirs == after
    assert agreed >= 3, agreed


def test_a_forked_child_writes_under_its_own_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A child forked with the devices open (a data-loader worker) still shares them."""
    for k, v in _env(tmp_path / "gpus", privileged=True).items():
        if k.startswith("ZEUS_"):
            monkeypatch.setenv(k, v)
    zeus.device.sim.reset()
    gpus = get_gpus()
    gpus.get_power_management_limit(0)
    pid = os.fork()
    if pid == 0:  # the child: change the device, then leave without running pytest's teardown
        code = 1
        try:
            for limit in range(250_000, 350_001, 1000):
                gpus.set_power_management_limit(0, limit)
            zeus.device.sim.set_busy(0, True)
            code = 0
        finally:
            os._exit(code)
    for _ in range(100):  # the parent writes at the same time
        zeus.device.sim.set_busy(1, True)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert gpus.get_power_management_limit(0) == 350_000
    assert zeus.device.sim.is_busy(0) and zeus.device.sim.is_busy(1)
