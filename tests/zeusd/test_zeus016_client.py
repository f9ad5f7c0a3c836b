"""Zeus 0.16's own client drives our zeusd (issue 13): power limits, clock locks, power streaming.

Zeus 0.16 is on PyPI as `zeus`, the import name of this package too, so it runs in a venv of its
own (`zeus==0.16.0` and what pip resolves for it). SLOW ONCE: the session fixture creates that
venv (about 40 s: `python -m venv` plus `pip install`) and caches it in
`/tmp/zeus016-venv-0.16.0` (or `ZEUS016_VENV`); later runs reuse it after checking that it
imports. Without PyPI the test is skipped with the reason, except under `CI`, where it fails.

The daemon (`ZEUSD_BIN`, else `target/debug/zeusd` or `target/release/zeusd`) runs as root over
the simulated GPUs, shared across processes through `ZEUS_SIM_SHARED`. The Zeus 0.16 process
(`zeus016_client_script.py`) loads our simulated `libnvidia-ml.so.1` through `LD_LIBRARY_PATH`
with the same devices, unprivileged (`ZEUS_SIM_PRIVILEGED=0`): its own NVML writes fail, its
NVML reads see what the daemon wrote. What it drives, all of Zeus 0.16's own code:

- `zeus.device.get_gpus()` → `NVIDIAGPUs`, which picks `ZeusdNVIDIAGPU` (over
  `zeus.utils.zeusd.ZeusdClient`, configured by `ZEUSD_SOCK_PATH`) for every GPU: set the power
  limit, read it back (NVML), lock GPU and memory clocks, reset them.
- `ZeusdClient` directly: `get_power_limit`, `get_gpu_power`.
- `zeus.monitor.power_streaming.PowerStreamingClient`: ~1 s of server-sent power events.

NVML has no getter for locked clocks (and the simulated clocks do not follow a lock), so the clock
locks are checked through our daemon's per-client ownership instead: while the Zeus process holds
a lock, another client asking for a different one gets 409.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import childproc
import pytest
from zeusd_daemon import SIM_STATE, Daemon, running_zeusd

ZEUS016 = "0.16.0"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "zeus016_client_script.py"
NVML_DIR = REPO / "python" / "zeus" / "_bin"
MODELS = "H100,A40"
N_GPUS = 2


def _venv_works(python: Path) -> bool:
    check = (
        "import importlib.metadata as m, zeus.utils.zeusd, zeus.monitor.power_streaming; "
        f"assert m.version('zeus') == {ZEUS016!r}"
    )
    try:
        return (
            python.is_file()
            and subprocess.run(
                [str(python), "-I", "-c", check], capture_output=True, timeout=120
            ).returncode
            == 0
        )
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="session")
def zeus016_python() -> Path:
    """A Python with Zeus 0.16 installed: the cached venv, or a new one (slow, once)."""
    venv = Path(os.environ.get("ZEUS016_VENV", f"/tmp/zeus016-venv-{ZEUS016}"))
    python = venv / "bin" / "python"
    if _venv_works(python):
        return python
    # Build beside it and rename, so that an interrupted install never looks like a cache.
    venv.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f"{venv.name}.build-", dir=venv.parent))
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(build)], check=True, capture_output=True, timeout=300
        )
        pip = subprocess.run(
            [str(build / "bin" / "python"), "-m", "pip", "install", "-q", f"zeus=={ZEUS016}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if pip.returncode != 0:
            reason = f"cannot install zeus=={ZEUS016} from PyPI: {pip.stderr.strip()[-1500:]}"
            if os.environ.get("CI"):
                pytest.fail(reason)
            pytest.skip(reason)
        shutil.rmtree(venv, ignore_errors=True)
        try:
            build.rename(venv)
        except OSError:  # another session put one there meanwhile
            if not _venv_works(python):
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    assert _venv_works(python), f"the new venv {venv} does not import zeus {ZEUS016}"
    return python


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """Our zeusd over UDS, as root, on simulated GPUs shared with the client."""
    with running_zeusd(tmp_path, MODELS, "uds") as d:
        try:
            yield d
        finally:
            print(f"--- zeusd log ---\n{d.log()}")  # shown when the test fails


def _payload(line: str) -> dict[str, Any]:
    return dict(json.loads(line.split(" ", 1)[1]))


@pytest.mark.timeout(900)  # the first run creates the venv
def test_zeus016_client_drives_our_daemon(
    zeus016_python: Path, daemon: Daemon, tmp_path: Path
) -> None:
    sock, http = daemon.env["ZEUSD_SOCK_PATH"], daemon.http
    original = daemon.power_limits()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUSD_", "ZEUS_", "CUDA_"))}
    env.pop("PYTHONPATH", None)  # our `zeus` must not shadow Zeus 0.16's
    env.update(
        ZEUSD_SOCK_PATH=str(sock),
        LD_LIBRARY_PATH=os.pathsep.join(
            p for p in (str(NVML_DIR), os.environ.get("LD_LIBRARY_PATH", "")) if p
        ),
        ZEUS_SIM_GPUS=MODELS,
        ZEUS_SIM_SHARED=str(tmp_path / SIM_STATE),
        ZEUS_SIM_PRIVILEGED="0",
        ZEUS_SIM_FIDELITY="ideal",
    )
    proc = subprocess.Popen(
        [str(zeus016_python), "-I", str(SCRIPT)],  # -I: no PYTHONPATH, no user site
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None and proc.stdin is not None
        holding = None
        for line in proc.stdout:
            if line.startswith("HOLDING "):
                holding = _payload(line)
                break
        if holding is None:
            out, err = childproc.finish(proc, timeout=30)
            pytest.fail(f"Zeus 0.16 client ended early (rc {proc.returncode}):\n{out}\n{err}")

        # --- While the Zeus 0.16 process is alive and holds its settings.
        assert holding["zeus_version"] == ZEUS016
        assert holding["gpu_classes"] == ["ZeusdNVIDIAGPU"] * N_GPUS, holding
        assert holding["daemon_gpu_ids"] == list(range(N_GPUS))
        targets = {}
        for i, g in enumerate(holding["gpus"]):
            assert g["direct_set"].get("error") == "NVMLError_NoPermission", g  # not privileged
            assert g["set"] == {"ok": None}, g
            assert g["after"] == g["target"] != g["before"], g  # NVML read of the shared GPU
            assert g["lock_gpu"] == {"ok": None}, g
            assert g["lock_mem"] == {"ok": None}, g
            # The locks the daemon made show in the client's own NVML clock reads.
            assert g["sm_clock_locked"] == {"ok": g["gfx_clocks"][0]}, g
            assert g["mem_clock_locked"] == {"ok": g["mem_clocks"][0]}, g
            targets[i] = g["target"]
        assert daemon.power_limits() == targets  # the daemon's own GET
        assert {int(k): v for k, v in holding["client_get_power_limit"].items()} == targets
        assert sorted(int(k) for k in holding["client_get_power"]) == list(range(N_GPUS))

        # The clock locks are held for the Zeus process: another client's different lock is 409.
        for i, g in enumerate(holding["gpus"]):
            lo, hi = g["gfx_clocks"]
            r = http.post(
                "/gpu/set_gpu_locked_clocks",
                params={"gpu_ids": i, "min_clock_mhz": hi, "max_clock_mhz": hi, "block": "true"},
            )
            assert r.status_code == 409, (i, r.status_code, r.text)
            lo, hi = g["mem_clocks"]
            if lo != hi:  # a board with one memory clock cannot be locked differently
                r = http.post(
                    "/gpu/set_mem_locked_clocks",
                    params={
                        "gpu_ids": i,
                        "min_clock_mhz": hi,
                        "max_clock_mhz": hi,
                        "block": "true",
                    },
                )
                assert r.status_code == 409, (i, r.status_code, r.text)

        stream = holding["stream"]
        assert stream["endpoints"] == [str(sock)]
        assert sorted(stream["gpus"]) == [str(i) for i in range(N_GPUS)], stream
        for gpu_id, s in stream["gpus"].items():
            assert s["n"] >= 5 and s["min_w"] > 0, (gpu_id, stream)  # ~20 Hz for ~1 s

        # --- Let it reset the clocks and exit.
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = childproc.finish(proc, timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"--- Zeus 0.16 client stderr ---\n{err}")
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, f"rc {proc.returncode}\n{out}\n{err}"
    result = _payload(results[-1])
    for g in result["gpus"]:
        assert g["reset_gpu"] == {"ok": None}, g
        assert g["reset_mem"] == {"ok": None}, g
    # Not even Zeus's Grace Hopper probe (`nvmlDeviceGetC2cModeInfoV`) warns: the simulated
    # NVML answers it NOT_SUPPORTED, as a real non-Grace board does.
    assert not result["warnings"], result["warnings"]

    # --- Our extra: the client is gone, so the daemon puts the original limits back.
    deadline = time.monotonic() + 2
    while daemon.power_limits() != original and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon.power_limits() == original
