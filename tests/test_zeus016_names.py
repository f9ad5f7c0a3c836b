"""Names that work here: the module paths of zeus 0.8.2 and Zeus 0.16 (aliases of the one
folder per concern), `show_env`, and the renamed client."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path


def test_module_aliases_are_the_same_modules():
    pairs = [
        ("zeus.utils", "zeus.util"),
        ("zeus.utils.metric", "zeus.util.metric"),
        ("zeus.utils.lr_scaler", "zeus.util.lr_scaler"),
        ("zeus.optimizer.pipeline_frequency", "zeus.optimizer.perseus"),
        (
            "zeus.optimizer.pipeline_frequency.frequency_controller",
            "zeus.optimizer.perseus.frequency_controller",
        ),
    ]
    for alias, real in pairs:
        assert importlib.import_module(alias) is importlib.import_module(real), alias
    from zeus.optimizer.pipeline_frequency import PerseusOptimizer, PipelineFrequencyOptimizer
    from zeus.utils.metric import zeus_cost

    assert PipelineFrequencyOptimizer is PerseusOptimizer
    assert zeus_cost is importlib.import_module("zeus.util.metric").zeus_cost


def test_recurring_job_modules_keep_the_reference_paths():
    real = "zeus.optimizer.recurring"
    pairs = [
        ("zeus.job", f"{real}.job"),
        ("zeus.policy", f"{real}.policy"),
        ("zeus.policy.optimizer", f"{real}.policy.optimizer"),
        ("zeus.run", f"{real}.run"),
        ("zeus.run.master", f"{real}.run.master"),
        ("zeus.simulate", f"{real}.simulate"),
        ("zeus.controller", f"{real}.controller"),
        ("zeus._legacy.policy", f"{real}.policy"),
        ("zeus._legacy.simulate", f"{real}.simulate"),
        ("zeus._legacy.job", f"{real}.job"),
        ("zeus.sim", "zeus.device.sim"),
    ]
    for alias, target in pairs:
        assert importlib.import_module(alias) is importlib.import_module(target), alias
    from zeus.job import Job
    from zeus.optimizer.recurring.job import Job as RealJob

    assert Job is RealJob


def test_python_dash_m_runs_through_an_alias():
    for alias in ("zeus.simulate", "zeus.sim"):
        out = subprocess.run(
            [sys.executable, "-m", alias, "--help"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, (alias, out.stderr)
        assert "usage:" in out.stdout, alias


def test_an_unknown_submodule_of_an_alias_is_an_import_error():
    import pytest

    with pytest.raises(ModuleNotFoundError, match="zeus.utils.nothing"):
        importlib.import_module("zeus.utils.nothing")


def _show_env(**env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "CUDA_"))}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "zeus.show_env"], env=full, capture_output=True, text=True
    )


def test_show_env_lists_versions_and_gpus():
    out = _show_env(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="H100,P100", ZEUS_SIM_FIDELITY="ideal")
    assert out.returncode == 0, out.stderr
    assert "zeus-energy: " in out.stdout and "Python: " in out.stdout
    assert "ZEUS_SIM_GPUS=H100,P100" in out.stdout
    assert "GPU backend: sim (2 visible)" in out.stdout
    assert "GPU 0: NVIDIA H100 80GB HBM3 (Simulated), hopper" in out.stdout
    assert "GPU 1: Tesla P100" in out.stdout and "no counter" in out.stdout


def test_show_env_says_why_there_are_no_gpus():
    out = _show_env(ZEUS_NVML_LIB="/nonexistent/libnvidia-ml.so.1")
    assert out.returncode == 0, out.stderr
    assert "GPUs: none available" in out.stdout and "ZEUS_GPU_BACKEND=sim" in out.stdout


ZEUS016_CODE = """
import time
import zeus.device.sim
from zeus.monitor import Measurement, PowerMonitor, ZeusMonitor

# 'No CPU' the way Zeus 0.16's docs say it for machines without RAPL access.
monitor = ZeusMonitor(gpu_indices=[0], cpu_indices=[])
assert monitor.cpu_indices is None
monitor.begin_window("step")
zeus.device.sim.set_busy(0)
zeus.device.sim.advance(1.0)
monitor.begin_window("step", restart=True)  # drops the open window, starts it again
zeus.device.sim.advance(0.5)
m = monitor.end_window("step")
assert abs(m.time - 0.5) < 1e-9, m.time

built = Measurement(time=1.5, gpu_energy={0: 300.0})
assert built.gpu_energy == {0: 300.0} and built.energy == {0: 300.0}

pm = PowerMonitor(gpu_indices=[0], update_period=0.05)
zeus.device.sim.advance(0.2)
pm.sample_now()
timeline = pm.get_power_timeline(power_domain="device_instant", gpu_index=0)
same = pm.get_power_timeline(gpu_power_domain="device_instant", gpu_index=0)
assert timeline[0] and timeline == same
print("ok")
"""


def test_zeus016_window_measurement_and_timeline_calls_work_unchanged():
    """Zeus 0.16 code: `cpu_indices=[]`, `begin_window(..., restart=True)`,
    `Measurement(time=..., gpu_energy=...)`, `get_power_timeline(power_domain=...)`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_")}
    env.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="A40", ZEUS_SIM_CLOCK="virtual")
    out = subprocess.run(
        [sys.executable, "-c", ZEUS016_CODE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_zeus016_argument_pairs_that_disagree_are_refused(sim_gpus):
    import pytest
    from zeus.monitor import Measurement, PowerMonitor

    sim_gpus("A40")
    with pytest.raises(ValueError, match="energy .* or gpu_energy"):
        Measurement(time=1.0, energy={0: 1.0}, gpu_energy={0: 1.0})
    with pytest.raises(ValueError, match="needs the GPU energy"):
        Measurement(time=1.0)
    pm = PowerMonitor(gpu_indices=[0])
    with pytest.raises(ValueError, match="disagree"):
        pm.get_power_timeline(gpu_power_domain="device_instant", power_domain="device_average")


def test_zeus016_measurement_states_have_its_attributes(sim_gpus):
    """Zeus 0.16 code reads `monitor.measurement_states[name].time` and its start energies;
    zeus 0.8.2 code unpacks the same entry as `(start_time, {gpu: start_energy_J})`."""
    import pickle

    import pytest
    import zeus.device.sim
    from zeus.monitor import ZeusMonitor
    from zeus.monitor.energy import MeasurementState

    sim_gpus("A40,P100")
    zeus.device.sim.set_busy(0)
    zeus.device.sim.advance(2.0)
    monitor = ZeusMonitor(gpu_indices=[0, 1])
    monitor.begin_window("step")
    state = monitor.measurement_states["step"]
    assert isinstance(state, MeasurementState)
    assert state.time == zeus.device.sim.now()
    # Only GPUs with an energy counter (the P100 has none), J, as in Zeus 0.16.
    assert set(state.gpu_energy) == {0}
    assert state.gpu_energy[0] == pytest.approx(zeus.device.sim.true_energy(0), rel=1e-6)
    assert state.gpu_energy[0] > 0
    assert state.cpu_energy is None and state.dram_energy is None  # no CPU monitored
    assert state.total_energy == pytest.approx(state.gpu_energy[0])
    start, energies = state  # 0.8.2's shape
    assert (start, energies) == (state.time, state.gpu_energy) == (state[0], state[1])
    assert state == (state.time, state.gpu_energy) and len(state) == 2
    assert pickle.loads(pickle.dumps(state)) == state
    assert "time=" in repr(state) and "cpu_energy=None" in repr(state)
    zeus.device.sim.advance(1.0)
    monitor.end_window("step")
    assert monitor.measurement_states == {}


def test_get_ip_lat_long_lives_at_zeus016_path_once():
    from local_api import LocalApi
    from zeus.monitor import carbon
    from zeus.utils.lat_lon import ZeusCarbonIntensityHTTPError, get_ip_lat_long

    assert get_ip_lat_long is carbon.get_ip_lat_long
    assert ZeusCarbonIntensityHTTPError is carbon.ZeusCarbonIntensityHTTPError
    assert importlib.import_module("zeus.utils.lat_lon") is importlib.import_module(
        "zeus.util.lat_lon"
    )
    api = LocalApi()
    try:
        api.routes = {"/json": (200, {"loc": "37.7749,-122.4194"})}
        assert get_ip_lat_long(f"{api.url}/json") == (37.7749, -122.4194)
    finally:
        api.close()


def test_zeusd_client_at_zeus016_path(monkeypatch, tmp_path):
    import pytest
    from zeus.device import zeusd
    from zeus.device.exception import ZeusdConnectionError
    from zeus.utils.zeusd import ZeusdClient, ZeusdConfig

    assert importlib.import_module("zeus.utils.zeusd") is zeusd
    assert ZeusdClient is zeusd.ZeusdClient and ZeusdConfig is zeusd.ZeusdConfig
    # `zeus.utils` itself is still `zeus.util`, and its other modules still resolve.
    assert importlib.import_module("zeus.utils") is importlib.import_module("zeus.util")
    assert importlib.import_module("zeus.utils.metric") is importlib.import_module(
        "zeus.util.metric"
    )
    tcp = ZeusdConfig.tcp("node1", 4938, token="t")
    assert (tcp.host, tcp.port, tcp.token, tcp.endpoint) == ("node1", 4938, "t", "node1:4938")
    uds = ZeusdConfig.uds("/run/zeusd/zeusd.sock")
    assert uds.socket_path == "/run/zeusd/zeusd.sock" and uds.host is None
    assert ZeusdClient(tcp).endpoint == "node1:4938"
    # Zeus 0.16's `ZeusdClient()`: the daemon the environment names.
    with pytest.raises(ZeusdConnectionError, match="ZEUSD_SOCK_PATH or ZEUSD_HOST_PORT"):
        ZeusdClient()
    sock = str(tmp_path / "zeusd.sock")
    monkeypatch.setenv("ZEUSD_SOCK_PATH", sock)
    assert ZeusdClient().endpoint == sock  # nothing connects until the first request


def test_power_domain_enum(sim_gpus):
    import zeus.device.sim
    from zeus.monitor.power import PowerDomain, PowerMonitor

    assert [d.value for d in PowerDomain] == ["device_instant", "device_average", "memory_average"]
    assert PowerDomain("device_average") is PowerDomain.DEVICE_AVERAGE
    sim_gpus("A40")
    pm = PowerMonitor(
        gpu_indices=[0], power_domains=[PowerDomain.DEVICE_INSTANT, PowerDomain.DEVICE_AVERAGE]
    )
    assert pm.power_domains == ["device_instant", "device_average"]
    zeus.device.sim.advance(0.2)
    pm.sample_now()
    by_enum = pm.get_power_timeline(PowerDomain.DEVICE_AVERAGE, gpu_index=0)
    assert by_enum[0] and by_enum == pm.get_power_timeline("device_average", gpu_index=0)
    timelines = pm.get_all_power_timelines()
    assert timelines[PowerDomain.DEVICE_INSTANT] == timelines["device_instant"]


def test_get_soc_says_there_is_no_soc_support():
    import pytest
    from zeus.device import get_soc
    from zeus.device.exception import ZeusBaseSoCError
    from zeus.device.soc import get_soc as soc_get_soc
    from zeus.device.soc.common import ZeusSoCInitError

    assert get_soc is soc_get_soc
    with pytest.raises(ZeusSoCInitError, match="No observable SoC.*no SoC support") as err:
        get_soc()
    assert isinstance(err.value, ZeusBaseSoCError)


def test_get_current_cpu_index_is_the_package_of_the_pinned_cpu():
    """In a child pinned to each CPU in turn, the index is that CPU's `physical_package_id`."""
    import pytest

    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/sys/devices/system/cpu"):
        pytest.skip("needs Linux CPU affinity and topology")
    code = """
import json, os
from zeus.device.cpu import get_current_cpu_index
out = []
for cpu in sorted(os.sched_getaffinity(0)):
    os.sched_setaffinity(0, {cpu})
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"
    with open(path) as f:
        out.append([int(f.read()), get_current_cpu_index(), get_current_cpu_index(os.getpid())])
print(json.dumps(out))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    rows = json.loads(out.stdout)
    assert rows and all(want == got == by_pid for want, got, by_pid in rows), rows


def test_get_current_cpu_index_refuses_bad_pids():
    import pytest
    from zeus.device.cpu import get_current_cpu_index

    for bad in (0, -3, True, "self", 1.5):
        with pytest.raises(ValueError, match="pid="):
            get_current_cpu_index(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pid=4194304\d*: no such process"):
        get_current_cpu_index(4194304 * 10)


def test_device_submodules_at_zeus016_paths():
    import zeus.device.cpu as cpu
    import zeus.device.exception as exc
    import zeus.device.gpu as gpu
    from zeus.device.cpu.common import CpuDramMeasurement, CPUs, ZeusRAPLPermissionError
    from zeus.device.gpu.common import GPUs, ZeusGPUInitError, ZeusGPUNotSupportedError
    from zeus.device.gpu.nvidia import NVIDIAGPUs, nvml_is_available

    assert (CpuDramMeasurement, CPUs) == (cpu.CpuDramMeasurement, cpu.CPUs)
    assert ZeusRAPLPermissionError is cpu.ZeusRAPLPermissionError
    assert GPUs is gpu.GPUs is NVIDIAGPUs
    assert (ZeusGPUInitError, ZeusGPUNotSupportedError) == (
        exc.ZeusGPUInitError,
        exc.ZeusGPUNotSupportedError,
    )
    # The names that were there before the package split are still there.
    for name in ("GPUs", "get_gpus", "reset_gpus", "ZeusGPUInitError", "ZeusdError"):
        assert hasattr(gpu, name), name
    assert callable(nvml_is_available)


def test_nvml_is_available_says_what_backs_the_gpus(sim_gpus):
    from zeus.device.gpu.nvidia import nvml_is_available

    sim_gpus("A40")
    assert nvml_is_available() is False  # the simulator stands in for NVML
    # No NVML library: False, not an exception. In a fresh process: NVML, once loaded by an
    # earlier test, stays loaded for the process's life.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_")}
    env.update(ZEUS_GPU_BACKEND="nvml", ZEUS_NVML_LIB="/nonexistent/libnvidia-ml.so.1")
    python_dir = str(Path(__file__).resolve().parents[1] / "python")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [python_dir, env.get("PYTHONPATH")]))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from zeus.device.gpu.nvidia import nvml_is_available; print(nvml_is_available())",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


SPAWN_SCRIPT = """
import json
import multiprocessing as mp
import warnings

warnings.simplefilter("always")
log = warnings.catch_warnings(record=True).__enter__()

from zeus.monitor import ZeusMonitor
from zeus.utils.multiprocessing import warn_if_global_in_subprocess


class Probe:
    def __init__(self):
        warn_if_global_in_subprocess(self)


probe = Probe()
monitor = ZeusMonitor(gpu_indices=[0])


def child(q):
    Probe()  # in a function: no warning
    q.put([(str(w.message), w.lineno) for w in log])


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    print(json.dumps({"parent": len(log), "child": q.get(timeout=60)}))
    p.join()
"""


def test_monitors_made_at_module_level_of_a_spawned_child_warn(tmp_path):
    """Zeus 0.16's `zeus.utils.multiprocessing.warn_if_global_in_subprocess`, which
    `ZeusMonitor` calls too: only the child's re-import of the script warns, at the line."""
    script = tmp_path / "train.py"
    script.write_text(SPAWN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_")}
    env.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="A40")
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["parent"] == 0
    lines = SPAWN_SCRIPT.splitlines()
    (probe, probe_line), (mon, mon_line) = seen["child"]
    assert probe.startswith("Probe was created while a spawned process") and "__main__" in probe
    assert mon.startswith("ZeusMonitor was created")
    assert lines[probe_line - 1] == "probe = Probe()"
    assert lines[mon_line - 1] == "monitor = ZeusMonitor(gpu_indices=[0])"
