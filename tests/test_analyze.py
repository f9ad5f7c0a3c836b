"""zeus.analyze over zeus-monitor CSV logs."""

from __future__ import annotations

import json
import struct
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


# ---------------------------------------------------------------------------------------------
# EnergyLedger logs: `read_ledger_log`, the J/token-by-batch table, `plot_serving`, `serving`.


def ledger_line(rid: str, model: str, energy: float, tokens: float, batch: float, **kw) -> str:
    """One log line as `EnergyLedger` writes it (`RequestEnergy.to_json()`)."""
    from zeus.monitor.serving import RequestEnergy

    fields = dict(
        request_id=rid,
        model=model,
        labels={},
        method="tokens",
        arrival=0.0,
        first_step=0.0,
        finish=1.0,
        finished=True,
        energy=energy,
        energy_bound=0.01,
        prefill_energy=energy / 4,
        decode_energy=energy * 3 / 4,
        gpu_energy={0: energy},
        prefill_tokens=100.0,
        decode_tokens=tokens,
        output_tokens=tokens,
        steps=int(tokens),
        mean_batch=batch,
        fitted=True,
    )
    fields.update(kw)
    return json.dumps(RequestEnergy(**fields).to_json())  # type: ignore[arg-type]


# (model, J, output tokens, mean batch): J/token 2, 4, 3 at batch 1-2; 1, 0.5 at 4-8; 0.25 at 16.
SYNTHETIC = [
    ("llama", 20.0, 10, 1.0),
    ("llama", 40.0, 10, 1.5),
    ("llama", 30.0, 10, 1.99),
    ("llama", 10.0, 10, 4.0),
    ("llama", 5.0, 10, 7.5),
    ("llama", 2.5, 10, 16.0),
    ("qwen", 9.0, 3, 2.0),
]


def synthetic_log(path: Path) -> Path:
    lines = [ledger_line(f"r{k}", *row) for k, row in enumerate(SYNTHETIC)]
    # Not in the table: unfinished, no token generated, never ran in a step.
    lines.append(ledger_line("open", "llama", 99.0, 10, 1.0, finished=False))
    lines.append(ledger_line("silent", "llama", 7.0, 0, 1.0))
    lines.append(ledger_line("never", "llama", 0.0, 0, 0.0, steps=0))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_read_ledger_log_reads_what_the_ledger_wrote(sim_gpus, tmp_path: Path):
    import zeus.device.sim
    from zeus.analyze import read_ledger_log
    from zeus.monitor import ZeusMonitor
    from zeus.monitor.serving import EnergyLedger

    sim_gpus("H100")
    zeus.device.sim.set_power(0, 300.0)
    log = tmp_path / "ledger.jsonl"
    with EnergyLedger(
        ZeusMonitor(gpu_indices=[0]), method="tokens", model="m", log_path=log
    ) as ledger:
        ledger.arrive("a", labels={"tenant": "x"})
        ledger.arrive("b", model="other")
        ledger.arrive("c")
        zeus.device.sim.advance(0.02)
        ledger.end_step(["a", "b", "c"], [30, 10, 5], [0, 0, 0], [30, 10, 5])
        zeus.device.sim.advance(0.02)
        ledger.end_step(["a", "b"], [0, 0], [1, 1], [31, 11])
        ledger.finish("a")
        ledger.finish("b", output_tokens=7)
    records = read_ledger_log(log)
    written = {r.request_id: r for r in ledger.records}
    assert [r.request_id for r in records] == ["a", "b", "c"]
    for r in records:
        w = written[r.request_id]
        assert (r.model, r.labels, r.method, r.finished) == (
            w.model,
            w.labels,
            "tokens",
            w.finished,
        )
        assert (r.energy, r.energy_bound, r.output_tokens) == (
            w.energy,
            w.energy_bound,
            w.output_tokens,
        )
        assert (r.prefill_energy, r.decode_energy) == (w.prefill_energy, w.decode_energy)
        assert (r.steps, r.mean_batch) == (w.steps, w.mean_batch)
        if w.output_tokens:
            assert r.joules_per_output_token == w.joules_per_output_token
    assert [r.mean_batch for r in records] == [2.5, 2.5, 3.0]
    assert not records[2].finished  # `c` was open at the close


def test_read_ledger_log_names_the_bad_line(tmp_path: Path):
    from zeus.analyze import read_ledger_log

    log = synthetic_log(tmp_path / "ledger.jsonl")
    lines = log.read_text().splitlines()
    assert len(read_ledger_log(log)) == len(lines)
    # A last line cut short by a killed process (no newline after it) is left out.
    log.write_text("\n".join(lines) + "\n" + lines[0][:30])
    assert len(read_ledger_log(log)) == len(lines)
    # Blank lines are skipped.
    log.write_text("\n".join(lines[:2]) + "\n\n" + lines[2] + "\n")
    assert len(read_ledger_log(log)) == 3
    for k, bad, message in (
        (2, lines[2][:30], "line 3 is not JSON"),
        (
            1,
            '{"request_id": "x", "model": "m"}',
            "line 2 is not an EnergyLedger record.*no finished, energy, output_tokens, mean_batch",
        ),
        (0, "[1, 2]", "line 1 is not an EnergyLedger record"),
        (3, lines[3].replace('"energy": 10.0', '"energy": "ten"'), "line 4: energy 'ten' is not"),
        (4, lines[4].replace('"finished": true', '"finished": 1'), "line 5: finished 1 is not"),
    ):
        broken = list(lines)
        broken[k] = bad
        log.write_text("\n".join(broken) + "\n")
        with pytest.raises(ValueError, match=message):
            read_ledger_log(log)
    # A broken last line followed by a newline was written whole: an error.
    log.write_text("\n".join([*lines[:2], lines[2][:30]]) + "\n")
    with pytest.raises(ValueError, match="line 3 is not JSON"):
        read_ledger_log(log)


def test_the_table_has_the_median_joules_per_token_of_each_batch_range(tmp_path: Path):
    from zeus.analyze import format_batch_table, joules_per_token_by_batch, read_ledger_log

    buckets = joules_per_token_by_batch(read_ledger_log(synthetic_log(tmp_path / "l.jsonl")))
    got = [
        (b.model, b.low, b.high, b.requests, b.median_batch, b.median_joules_per_output_token)
        for b in buckets
    ]
    assert got == [
        ("llama", 1.0, 2.0, 3, 1.5, 3.0),  # J/token 2, 4, 3
        ("llama", 4.0, 8.0, 2, 5.75, 0.75),  # 1 and 0.5
        ("llama", 16.0, 32.0, 1, 16.0, 0.25),
        ("qwen", 2.0, 4.0, 1, 2.0, 3.0),
    ]
    table = format_batch_table(buckets).splitlines()
    assert table[0].split() == [
        "model",
        "mean",
        "batch",
        "requests",
        "median",
        "batch",
        "median",
        "J/token",
    ]
    assert table[1].split() == ["llama", "[1,", "2)", "3", "1.5", "3"]
    assert table[2].split() == ["llama", "[4,", "8)", "2", "5.75", "0.75"]
    assert table[4].split() == ["qwen", "[2,", "4)", "1", "2", "3"]


def test_the_serving_command_prints_the_table_and_plots_a_png(tmp_path: Path):
    pytest.importorskip("matplotlib")
    log = synthetic_log(tmp_path / "ledger.jsonl")
    out = tmp_path / "jpt.png"
    r = subprocess.run(
        [sys.executable, "-m", "zeus.analyze", "serving", str(log), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["llama", "[1,", "2)", "3", "1.5", "3"]
    assert lines[-1] == str(out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 600)
    # Without --out: the table only.
    r = subprocess.run(
        [sys.executable, "-m", "zeus.analyze", "serving", str(log)], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.splitlines() == lines[:-1], r.stderr
    # A bad line: one line of error naming it, no traceback.
    log.write_text(log.read_text().replace('"energy": 20.0', '"energy": null, "x": [', 1))
    r = subprocess.run(
        [sys.executable, "-m", "zeus.analyze", "serving", str(log)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "line 1 is not JSON" in r.stderr and "Traceback" not in r.stderr


def test_plot_serving_draws_every_request_and_the_medians(tmp_path: Path):
    pytest.importorskip("matplotlib")
    from zeus.analyze import plot_serving

    log = synthetic_log(tmp_path / "ledger.jsonl")
    fig = plot_serving([log], tmp_path / "jpt.svg", (800, 400), title="t")
    (ax,) = fig.axes
    assert ax.get_title() == "t"
    assert ax.get_yscale() == "log"  # 0.25 to 4 J/token
    assert ax.get_xscale() == "log"  # batch 1 to 16
    points = sorted(len(c.get_offsets()) for c in ax.collections)
    assert points == [1, 6]  # qwen's one request, llama's six usable
    medians = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert medians["llama: median per batch size range"] == [3.0, 0.75, 0.25]
    assert (tmp_path / "jpt.svg").read_text().lstrip().startswith("<?xml")
    empty = tmp_path / "empty.jsonl"
    empty.write_text(ledger_line("open", "m", 1.0, 1, 1.0, finished=False) + "\n")
    with pytest.raises(ValueError, match="no finished request that generated tokens"):
        plot_serving([empty], tmp_path / "x.png")
