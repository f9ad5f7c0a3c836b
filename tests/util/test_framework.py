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


def _run(code: str, path: str | None = None) -> str:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_")}
    env.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="A40,A40", ZEUS_SIM_CLOCK="virtual")
    if path is not None:
        env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_no_sync_path_imports_a_framework_to_ask() -> None:
    """A window sync, zeus.metric's sync and the availability checks leave PyTorch unimported."""
    code = (
        "import sys\n"
        "from zeus.util import framework\n"
        "from zeus.monitor import ZeusMonitor\n"
        "import zeus.metric\n"
        "assert framework.imported_sync() is None and not framework.sync_available()\n"
        "m = ZeusMonitor(gpu_indices=[0])\n"
        "m.begin_window('w', sync_cuda=True)\n"
        "m.end_window('w', sync_cuda=True)\n"
        "zeus.metric._sync(None)\n"
        "try:\n"
        "    framework.cuda_sync()\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
        "print(sorted(m for m in ('torch', 'jax', 'cupy') if m in sys.modules))\n"
    )
    assert _run(code).splitlines() == ["No frameworks are available.", "[]"]


def test_every_caller_syncs_through_the_framework_the_program_imported(tmp_path) -> None:
    """With a framework imported (a stand-in `torch` that records its syncs), every door syncs
    through it: ZeusMonitor windows, zeus.metric, cuda_sync; a named other framework does not."""
    stub = tmp_path / "torch"
    stub.mkdir()
    (stub / "__init__.py").write_text(
        "import types\n"
        "synced = []\n"
        "cuda = types.SimpleNamespace(is_available=lambda: True, synchronize=synced.append)\n"
    )
    code = (
        "import torch\n"
        "from zeus.util import framework\n"
        "from zeus.monitor import ZeusMonitor\n"
        "import zeus.metric\n"
        "m = ZeusMonitor(gpu_indices=[1])\n"
        "m.begin_window('w', sync_cuda=True)\n"
        "m.end_window('w', sync_cuda=True)\n"
        "zeus.metric._sync([0, 1])\n"
        "framework.cuda_sync(1)\n"
        "assert framework.imported_sync('jax') is None\n"
        "ZeusMonitor(gpu_indices=[1], sync_execution_with='jax').begin_window('j')\n"
        "print(torch.synced)\n"
    )
    assert _run(code, str(tmp_path)) == "[1, 1, 0, 1, 1]"


_RANK = """
import json, sys
import torch.distributed as dist
from zeus.util import framework

rank, port = int(sys.argv[1]), sys.argv[2]
alone = (framework.rank(), framework.world_size(), framework.all_reduce([1.5], "sum"))
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
print("RESULT", json.dumps({
    "alone": alone,
    "rank": framework.rank(),
    "world": framework.world_size(),
    "sum": framework.all_reduce([1.0 + rank, 10.0 * rank], "sum"),
    "max": framework.all_reduce([1.0 + rank, -rank], "max"),
    "broadcast": framework.broadcast_object({"from": rank}),
}), flush=True)
dist.destroy_process_group()
"""


def test_collectives_across_two_gloo_ranks(tmp_path) -> None:
    """The one door to torch.distributed: alone it is rank 0 of one; in a group of two, sums,
    maxima and rank 0's object reach both ranks."""
    pytest.importorskip("torch", reason="torch is not installed")
    import os
    from pathlib import Path

    from childproc import run_ranks

    env = dict(os.environ)
    python_dir = str(Path(framework.__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [python_dir, env.get("PYTHONPATH")]))
    results = run_ranks(_RANK, env)
    for rank, r in enumerate(results):
        assert r["alone"] == [0, 1, [1.5]]
        assert (r["rank"], r["world"]) == (rank, 2)
        assert r["sum"] == [3.0, 10.0]
        assert r["max"] == [2.0, 0.0]
        assert r["broadcast"] == {"from": 0}


def test_all_reduce_names_a_bad_operation() -> None:
    with pytest.raises(ValueError, match="'mean'"):
        framework.all_reduce([1.0], "mean")  # type: ignore[arg-type]
