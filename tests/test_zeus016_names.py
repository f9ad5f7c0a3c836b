"""Zeus 0.16 names that work here: module aliases, `show_env`, and the renamed client."""

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


def test_an_unknown_submodule_of_an_alias_is_an_import_error():
    import pytest

    with pytest.raises(ModuleNotFoundError, match="zeus.util.nothing"):
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
