"""Command-line tools as subprocesses: `python -m zeus.monitor` and the `zeus-monitor` binary."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from childproc import default_sigint, finish

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{9},\d+$")


def sim_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ZEUS_") and k != "CUDA_VISIBLE_DEVICES"
    }
    env.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="A40,V100", **extra)
    return env


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        if needle in line:
            return seen
        if proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"never saw {needle!r}; output so far: {seen!r}")


@pytest.mark.parametrize("mode", ["power", "energy"])
def test_python_cli_prints_summary_on_sigint(mode: str):
    args = [sys.executable, "-m", "zeus.monitor", mode, "--gpu-indices", "1", "0"]
    if mode == "power":
        args += ["--update-period", "0.01"]
    proc = subprocess.Popen(
        args,
        env=sim_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    wait_for_line(proc, "Ctrl-C to stop")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    if mode == "power":
        assert "Total time (s):" in out
        energy = re.search(r"Total energy \(J\): \{'GPU1': ([\d.]+), 'GPU0': ([\d.]+)\}", out)
        assert energy, out
        seconds = float(re.search(r"Total time \(s\): ([\d.]+)", out).group(1))
        # Idle simulated A40 draws 30 W.
        assert float(energy.group(2)) == pytest.approx(30.0 * seconds, rel=0.1)
    else:
        assert re.search(r"Total energy \(J\): Measurement\(time=[\d.]+, energy=\{1: ", out), out


def test_python_cli_bad_gpu_index_is_an_error():
    proc = subprocess.run(
        [sys.executable, "-m", "zeus.monitor", "power", "--gpu-indices", "7"],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "GPU index 7" in proc.stdout


@pytest.fixture
def zeus_monitor_bin() -> Path:
    for cand in (
        REPO / "python" / "zeus" / "_bin" / "zeus-monitor",
        REPO / "target" / "debug" / "zeus-monitor",
    ):
        if cand.is_file():
            return cand
    pytest.skip("zeus-monitor is not built (cargo build -p zeus-cli)")


def test_zeus_monitor_reference_form(zeus_monitor_bin: Path, tmp_path: Path):
    out = tmp_path / "out.csv"
    proc = subprocess.run(
        [zeus_monitor_bin, out, "2", "10"],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == "Time,Power"
    # 2 s, 10 ms sleep after each poll (plus the poll itself): about 200 rows.
    assert 150 <= len(lines) - 1 <= 201, len(lines)
    assert all(ROW.match(line) for line in lines[1:])
    assert "[ZeusMonitor] Wrote" in proc.stderr


def test_zeus_monitor_sigterm_keeps_complete_rows(zeus_monitor_bin: Path, tmp_path: Path):
    out = tmp_path / "out.csv"
    proc = subprocess.Popen(
        [zeus_monitor_bin, out, "0", "1"],
        env=sim_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.6)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    text = out.read_text()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert lines[0] == "Time,Power"
    assert len(lines) > 20
    assert all(ROW.match(line) for line in lines[1:]), text[-300:]
    assert f"Wrote {len(lines) - 1} samples" in err
    assert "SIGTERM" in err


def test_zeus_monitor_output_feeds_analyze(zeus_monitor_bin: Path, tmp_path: Path):
    from zeus.analyze import avg_power, energy

    out = tmp_path / "out.csv"
    subprocess.run(
        [zeus_monitor_bin, out, "0.5", "0", "1", "--interval", "10"],
        env=sim_env(),
        check=True,
        capture_output=True,
        timeout=60,
    )
    # GPU 1 is an idle simulated V100 (25 W).
    assert avg_power(out) == pytest.approx(25.0, rel=0.05)
    assert energy(out) == pytest.approx(25.0 * 0.5, rel=0.1)
