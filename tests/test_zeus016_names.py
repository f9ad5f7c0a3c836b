"""Names that work here: the module paths of zeus 0.8.2 and Zeus 0.16 (aliases of the one
folder per concern), `show_env`, and the renamed client."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys


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
