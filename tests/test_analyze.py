"""zeus.analyze over zeus-monitor CSV logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zeus.analyze import HistoryEntry, avg_power, energy


def write_log(path: Path, seconds: list[float], power_mw: list[int]) -> Path:
    base = np.datetime64("2022-07-13T02:07:36.708783111", "ns")
    lines = ["Time,Power"]
    for s, p in zip(seconds, power_mw):
        t = base + np.timedelta64(int(round(s * 1e9)), "ns")
        lines.append(f"{str(t).replace('T', ' ')},{p}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_energy_and_avg_power_of_a_ramp(tmp_path: Path):
    # Power 100 W + 10 W/s for 10 s, sampled every 0.5 s, plus one trailing row that the
    # reference always drops (skipfooter=1).
    secs = [0.5 * k for k in range(21)] + [10.5]
    log = write_log(
        tmp_path / "log.csv", secs, [int(100_000 + 10_000 * s) for s in secs[:-1]] + [9]
    )
    assert energy(log) == pytest.approx(100 * 10 + 5 * 100)
    assert avg_power(log) == pytest.approx(150.0)
    assert energy(log, drop_last=False) > energy(log)
    # Windows relative to the first row; negative start/end count back from the last row.
    assert energy(log, start=2.0, end=4.0) == pytest.approx(2 * 100 + 5 * (16 - 4))
    assert energy(log, start=-2.0) == pytest.approx(2 * 100 + 5 * (100 - 64))
    assert energy(log, end=-8.0) == pytest.approx(2 * 100 + 5 * 4)
    assert avg_power(log, start=2.0, end=4.0) == pytest.approx(130.0)


def test_reference_timestamp_format_is_parsed_to_the_nanosecond(tmp_path: Path):
    log = tmp_path / "log.csv"
    log.write_text(
        "Time,Power\n"
        "2022-07-13 02:07:36.000000000,100000\n"
        "2022-07-13 02:07:36.000000001,100000\n"
        "2022-07-13 02:07:37.000000001,100000\n"
        "2022-07-13 02:07:38.0000000\n"  # partial last line, as a killed logger leaves it
    )
    assert energy(log) == pytest.approx(100.0)


def test_too_few_points_and_bad_files(tmp_path: Path):
    log = write_log(tmp_path / "log.csv", [0.0, 1.0], [1000, 1000])
    with pytest.raises(ValueError, match="At least 2 points"):
        energy(log)  # the last row is dropped: one point left
    with pytest.raises(ValueError, match="At least 2 points"):
        avg_power(log, start=5.0, drop_last=False)
    bad = tmp_path / "bad.csv"
    bad.write_text("Timestamp,Watts\n1,2\n")
    with pytest.raises(ValueError, match="is not a power log zeus writes.*'Time' and 'Power'"):
        energy(bad)


@settings(max_examples=50, deadline=None)
@given(
    gaps=st.lists(st.floats(0.001, 1.0), min_size=3, max_size=50),
    watts=st.floats(1.0, 500.0),
)
def test_constant_power_integrates_exactly(tmp_path_factory, gaps, watts):
    secs = list(np.cumsum([0.0, *gaps]))
    log = write_log(tmp_path_factory.mktemp("h") / "log.csv", secs, [int(watts * 1000)] * len(secs))
    span = secs[-2] - secs[0]
    assert energy(log) == pytest.approx(int(watts * 1000) / 1000 * span, rel=1e-6, abs=1e-6)
    assert avg_power(log) == pytest.approx(int(watts * 1000) / 1000, rel=1e-6)


def test_history_entry():
    h = HistoryEntry(bs=32, pl=250, energy=1.5, reached=True, time=2.0)
    assert (h.bs, h.pl, h.reached) == (32, 250, True)


BASE = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
WATTS = {0: 202.0, 1: 100.0}  # two GPUs at constant power for 10 s


def utc(seconds: float) -> str:
    t = np.datetime64(int(round(seconds * 1e9)), "ns")
    return str(t).replace("T", " ")


def two_gpu_logs(d: Path) -> dict[str, Path]:
    """The same 10 s of two GPUs (202 W and 100 W) in every format `energy` reads."""
    secs = [0.5 * k for k in range(21)]
    out = {}
    # A power logger's CSV and JSON lines: a trailing row (dropped, as the reference drops it),
    # and in the JSON lines a last line cut short by a killed logger.
    rows = [f"{utc(BASE + t)},{int(WATTS[0] * 1000)},{int(WATTS[1] * 1000)}" for t in secs]
    rows.append(f"{utc(BASE + 10.5)},1,1")
    out["csv"] = d / "zm.csv"
    out["csv"].write_text("Time,Power0,Power1\n" + "\n".join(rows) + "\n")
    lines = [
        json.dumps(
            {
                "time": utc(BASE + t),
                "unix_time": BASE + t,
                "power_mw": {str(g): int(w * 1000) for g, w in WATTS.items()},
            }
        )
        for t in [*secs, 10.5]
    ]
    out["jsonl"] = d / "zm.jsonl"
    out["jsonl"].write_text("\n".join(lines) + '\n{"time": "2023-11-1')
    # PowerMonitor dumps: get_power_timeline() and get_all_power_timelines(); used whole.
    timeline = {str(g): [[BASE + t, w] for t in secs] for g, w in WATTS.items()}
    out["dump"] = d / "timeline.json"
    out["dump"].write_text(json.dumps(timeline))
    out["all dump"] = d / "timelines.json"
    out["all dump"].write_text(json.dumps({"device_instant": timeline}))
    # A ZeusMonitor log: ten 1 s steps inside one 10 s epoch; only the steps count.
    header = "start_time,window_name,elapsed_time,gpu0_energy,gpu1_energy,"
    header += "gpu0_energy_uncertainty,gpu1_energy_uncertainty"
    rows = [f"{BASE + k},step,1.0,{WATTS[0]},{WATTS[1]},0.1,0.1" for k in range(10)]
    rows.append(f"{BASE},epoch,10.0,{WATTS[0] * 10},{WATTS[1] * 10},1,1")
    out["ZeusMonitor log"] = d / "windows.csv"
    out["ZeusMonitor log"].write_text(header + "\n" + "\n".join(rows) + "\n")
    return out


@pytest.mark.parametrize("kind", ["csv", "jsonl", "dump", "all dump", "ZeusMonitor log"])
def test_energy_and_avg_power_read_every_format_plot_reads(tmp_path: Path, kind: str):
    log = two_gpu_logs(tmp_path)[kind]
    total = sum(WATTS.values())
    assert energy(log) == pytest.approx(total * 10, rel=1e-9)
    assert avg_power(log) == pytest.approx(total, rel=1e-9)
    for gpu, watts in WATTS.items():
        assert energy(log, gpu=gpu) == pytest.approx(watts * 10, rel=1e-9)
        assert avg_power(log, gpu=gpu) == pytest.approx(watts, rel=1e-9)
    assert energy(log, start=2.0, end=4.0) == pytest.approx(total * 2, rel=1e-9)
    assert energy(log, start=-3.0) == pytest.approx(total * 3, rel=1e-9)
    with pytest.raises(ValueError, match="has no GPU 5; it logs GPUs 0, 1"):
        energy(log, gpu=5)


def test_the_command_line_reads_json_lines_too(tmp_path: Path):
    logs = two_gpu_logs(tmp_path)
    for command, args, expected in (
        ("energy", [str(logs["jsonl"])], 3020.0),
        ("energy", [str(logs["ZeusMonitor log"]), "--gpu", "1"], 1000.0),
        ("avg-power", [str(logs["jsonl"]), "--gpu", "0"], 202.0),
        ("avg-power", [str(logs["csv"]), "--start", "1", "--end", "3"], 302.0),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "zeus.analyze", command, *args],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        assert float(r.stdout) == pytest.approx(expected, rel=1e-9), (command, args)
    r = subprocess.run(
        [sys.executable, "-m", "zeus.analyze", "energy", str(logs["jsonl"]), "--gpu", "3"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "has no GPU 3" in r.stderr and "Traceback" not in r.stderr


def test_a_json_line_broken_before_the_last_is_an_error(tmp_path: Path):
    log = two_gpu_logs(tmp_path)["jsonl"]
    lines = log.read_text().splitlines()
    lines[3] = lines[3][:20]
    log.write_text("\n".join(lines))
    with pytest.raises(ValueError, match="line 4 is not JSON"):
        energy(log)
