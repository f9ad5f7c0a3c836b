"""`python -m zeus.monitor serve`: the bundled Prometheus exporter, started through Python."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from childproc import finish, served_address

BIN = Path(__file__).resolve().parents[2] / "python" / "zeus" / "_bin" / "zeus-monitor"


def sim_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ZEUS_") and k != "CUDA_VISIBLE_DEVICES"
    }
    env.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="H100,A40", ZEUS_SIM_LOAD="busy")
    return env


@pytest.fixture
def bundled() -> Path:
    if not BIN.is_file():
        pytest.skip(f"the bundled binary is missing at {BIN} (cargo build -p zeus-monitor, copy)")
    if b"serve" not in subprocess.run([BIN, "--help"], capture_output=True).stdout:
        pytest.skip(f"the bundled binary at {BIN} predates `serve`; rebuild and copy it")
    return BIN


def test_serve_starts_answers_and_stops(bundled: Path, tmp_path: Path):
    env = sim_env() | {"ZEUS_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "zeus.monitor", "serve", "--listen", "127.0.0.1:0", "--gpus", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://{served_address(proc)}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as r:
            assert (r.status, r.read()) == (200, b"ok")
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = r.read().decode()
        assert "# TYPE zeus_gpu_power_limit_watts gauge" in body
        assert re.search(
            r'zeus_gpu_power_limit_watts\{gpu="1",uuid="GPU-[^"]+",model="[^"]*A40', body
        )
        assert 'gpu="0"' not in body
        proc.send_signal(signal.SIGTERM)
        _, err = finish(proc, timeout=20)
        assert proc.returncode == 0, err
        assert "Stopped by SIGTERM" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_names_a_bad_listen_address(bundled: Path):
    out = subprocess.run(
        [sys.executable, "-m", "zeus.monitor", "serve", "--listen", "no-such-address"],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2, out
    assert "--listen" in out.stderr and "no-such-address" in out.stderr
