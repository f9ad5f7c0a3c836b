"""zeus.analyze over zeus-monitor CSV logs."""

from __future__ import annotations

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
    with pytest.raises(ValueError, match="expected 'Time' and 'Power'"):
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
