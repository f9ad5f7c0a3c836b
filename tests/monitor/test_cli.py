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


# A power log's time column: UTC to the nanosecond.
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{9}"


@pytest.mark.parametrize("mode", ["power", "energy"])
def test_python_cli_prints_summary_on_sigint(mode: str):
    args = [sys.executable, "-m", "zeus.monitor", mode, "--gpu-indices", "1", "0"]
    if mode == "power":
        args += ["--update-period", "0.01"]  # piped: CSV rows stream on stdout
    else:
        args += ["--format", "json"]
    proc = subprocess.Popen(
        args,
        env=sim_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    if mode == "power":
        # zeus-monitor's power log: UTC time, mW, columns in the order asked.
        assert proc.stdout.readline().strip() == "Time,Power1,Power0"
    else:
        assert "Ctrl-C to stop" in proc.stderr.readline()
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    if mode == "power":
        rows = [r.split(",") for r in out.strip().splitlines()]
        assert len(rows) > 10 and all(len(r) == 3 for r in rows), out
        times = [r[0] for r in rows]
        assert times == sorted(times) and all(re.fullmatch(TIME, t) for t in times), times
        assert all(int(r[2]) == pytest.approx(30_000, rel=0.05) for r in rows)  # idle A40, mW
        energy = re.search(r"Total energy \(J\): \{'GPU1': ([\d.]+), 'GPU0': ([\d.]+)\}", err)
        assert energy, err
        seconds = float(re.search(r"Total time \(s\): ([\d.]+)", err).group(1))
        assert float(energy.group(2)) == pytest.approx(30.0 * seconds, rel=0.1)
    else:
        import json

        m = json.loads(out)
        assert list(m["energy_j"]) == ["1", "0"] and m["time_s"] > 0.4
        assert m["total_energy_j"] == pytest.approx(sum(m["energy_j"].values()))
        assert m["energy_j"]["0"] == pytest.approx(30.0 * m["time_s"], rel=0.1)
        # Each GPU's energy comes with its bound and how it was made.
        assert set(m["energy_uncertainty_j"]) == {"1", "0"}
        assert all(b >= 0 for b in m["energy_uncertainty_j"].values())
        assert m["total_energy_uncertainty_j"] == pytest.approx(
            sum(m["energy_uncertainty_j"].values())
        )
        assert set(m["method"].values()) <= {"cached_counter", "direct_counter"}


def test_python_cli_energy_table_and_csv():
    for fmt, check in (
        ("table", lambda out: "total" in out and "energy (J)" in out and "±" in out),
        (
            "csv",
            lambda out: (
                out.splitlines()[0]
                == "time_s,gpu0_energy_j,gpu1_energy_j,total_energy_j,"
                "gpu0_energy_uncertainty_j,gpu1_energy_uncertainty_j"
                and len(out.splitlines()[1].split(",")) == 6
            ),
        ),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "zeus.monitor", "energy", "--duration", "0.3", "--format", fmt],
            env=sim_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0 and check(proc.stdout), (fmt, proc.stdout, proc.stderr)


def test_python_cli_bad_gpu_index_is_an_error():
    proc = subprocess.run(
        [sys.executable, "-m", "zeus.monitor", "power", "--gpu-indices", "7"],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "GPU index 7" in proc.stderr and "hint:" in proc.stderr


@pytest.fixture
def zeus_monitor_bin() -> Path:
    for cand in (
        REPO / "python" / "zeus" / "_bin" / "zeus-monitor",
        REPO / "target" / "debug" / "zeus-monitor",
    ):
        if cand.is_file():
            return cand
    pytest.skip("zeus-monitor is not built (cargo build -p zeus-monitor)")


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
