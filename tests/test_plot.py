"""`python -m zeus.analyze plot`: power timelines from every log format zeus writes."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from zeus.analyze import plot_power, read_power_log

pytest.importorskip("matplotlib")
REPO = Path(__file__).resolve().parents[1]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "CUDA_"))}
    e.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="H100,A40", ZEUS_SIM_LOAD="busy")
    e.update(ZEUS_SIM_FIDELITY="ideal", **extra)
    return e


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    """One log of each kind, written by the real tools on two simulated GPUs."""
    d = tmp_path_factory.mktemp("logs")
    out = {
        k: d / name
        for k, name in (
            ("zeus-monitor csv", "zm.csv"),
            ("zeus-monitor jsonl", "zm.jsonl"),
            ("monitor power csv", "pm.csv"),
            ("monitor power json", "pm.jsonl"),
            ("ZeusMonitor log", "windows.csv"),
            ("PowerMonitor dump", "timelines.json"),
        )
    }
    binary = REPO / "python" / "zeus" / "_bin" / "zeus-monitor"
    for key, fmt in (("zeus-monitor csv", "csv"), ("zeus-monitor jsonl", "jsonl")):
        subprocess.run(
            [
                str(binary),
                str(out[key]),
                "0.4",
                "0",
                "--interval",
                "20",
                "--gpus",
                "0,1",
                "--format",
                fmt,
            ],
            env=env(),
            check=True,
            capture_output=True,
        )
    for key, fmt in (("monitor power csv", "csv"), ("monitor power json", "json")):
        with open(out[key], "w") as f:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "zeus.monitor",
                    "power",
                    "--duration",
                    "0.4",
                    "--update-period",
                    "0.02",
                    "--format",
                    fmt,
                ],
                env=env(),
                check=True,
                stdout=f,
                stderr=subprocess.DEVNULL,
            )
    code = (
        "import time, warnings, zeus.device.sim\n"
        "warnings.simplefilter('ignore')\n"
        "from zeus.monitor import ZeusMonitor\n"
        f"m = ZeusMonitor(log_file={str(out['ZeusMonitor log'])!r})\n"
        "for k in range(3):\n"
        "    zeus.device.sim.set_busy(0, k % 2 == 0)\n"
        "    m.begin_window(f'w{k}', sync_cuda=False); time.sleep(0.1)\n"
        "    m.end_window(f'w{k}', sync_cuda=False)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env(), check=True)
    dump = (
        "import json, time\n"
        "from zeus.monitor import PowerMonitor\n"
        "with PowerMonitor(update_period=0.02) as pm:\n"
        "    time.sleep(0.3)\n"
        f"json.dump(pm.get_all_power_timelines(), open({str(out['PowerMonitor dump'])!r}, 'w'))\n"
    )
    subprocess.run([sys.executable, "-c", dump], env=env(), check=True)
    return out


@pytest.mark.parametrize(
    "kind",
    [
        "zeus-monitor csv",
        "zeus-monitor jsonl",
        "monitor power csv",
        "monitor power json",
        "ZeusMonitor log",
        "PowerMonitor dump",
    ],
)
def test_each_format_plots_one_line_per_gpu(logs, kind, tmp_path, sim_gpus):
    sim_gpus("H100,A40")  # the legend's model names come from the GPUs visible here
    series = read_power_log(logs[kind])
    assert sorted(series.watts) == [0, 1]
    assert all(len(w) == len(series.times) > 3 for w in series.watts.values())
    h100 = series.watts[0]
    assert max(h100) > 500 and (kind == "ZeusMonitor log") == series.steps
    png = tmp_path / "out.png"
    fig = plot_power([logs[kind]], png, size=(900, 450))
    assert png_size(png) == (900, 450)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2
    labels = [ln.get_label() for ln in lines]
    assert labels == ["GPU0 (NVIDIA H100 80GB HBM3 (Simulated))", "GPU1 (NVIDIA A40 (Simulated))"]


def test_both_power_loggers_write_one_schema(logs):
    """`zeus-monitor` and `python -m zeus.monitor power` write the same header and keys."""
    headers = {
        k: logs[k].read_text().splitlines()[0] for k in ("zeus-monitor csv", "monitor power csv")
    }
    assert set(headers.values()) == {"Time,Power0,Power1"}
    for kind in ("zeus-monitor jsonl", "monitor power json"):
        row = json.loads(logs[kind].read_text().splitlines()[0])
        assert set(row) == {"time", "unix_time", "power_mw"}, kind
        assert set(row["power_mw"]) == {"0", "1"} and all(
            isinstance(mw, int) for mw in row["power_mw"].values()
        )


def test_the_command_line_plots_several_files(logs, tmp_path):
    out = tmp_path / "all.svg"
    files = [str(logs["zeus-monitor csv"]), str(logs["monitor power json"])]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "zeus.analyze",
            "plot",
            *files,
            "-o",
            str(out),
            "--gpu-names",
            "H100,A40",
        ],
        env=env(ZEUS_NVML_LIB="/nonexistent"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    svg = out.read_text()
    assert svg.count("zm.csv: GPU") >= 2 and "pm.jsonl: GPU1 (A40)" in svg
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    r = subprocess.run(
        [sys.executable, "-m", "zeus.analyze", "plot", str(bad), "-o", str(tmp_path / "x.png")],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "is not a power log zeus writes" in r.stderr
    assert "Traceback" not in r.stderr
