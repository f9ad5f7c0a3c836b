"""zeus.util.testing.ReplayZeusMonitor."""

from __future__ import annotations

from pathlib import Path

import pytest
from zeus.util.testing import ReplayZeusMonitor

LOG = """start_time,window_name,elapsed_time,gpu0_energy,gpu2_energy
1.0,a,2.5,10.0,20.0
5.0,b,1.5,3.0,4.0
"""


@pytest.fixture
def log(tmp_path: Path) -> Path:
    p = tmp_path / "log.csv"
    p.write_text(LOG)
    return p


def test_replays_lines_in_end_order(log: Path) -> None:
    mon = ReplayZeusMonitor(log_file=log)
    assert mon.gpu_indices == [0, 2] and mon.nvml_gpu_indices == [0, 2]
    mon.begin_window("a")
    mon.begin_window("b")
    m = mon.end_window("a")
    assert (m.time, m.energy, m.total_energy) == (2.5, {0: 10.0, 2: 20.0}, 30.0)
    m = mon.end_window("b")
    assert (m.time, m.energy) == (1.5, {0: 3.0, 2: 4.0})
    mon.begin_window("c")
    with pytest.raises(RuntimeError, match="No more lines in the log file."):
        mon.end_window("c")


def test_window_errors_and_cancel(log: Path) -> None:
    mon = ReplayZeusMonitor(log_file=log)
    mon.begin_window("a")
    with pytest.raises(RuntimeError, match="Window a is already ongoing."):
        mon.begin_window("a")
    with pytest.raises(RuntimeError, match="Window x is not ongoing."):
        mon.end_window("x")
    m = mon.end_window("a", cancel=True)
    assert m.time == 0 and m.energy == {0: 0.0, 2: 0.0}
    mon.begin_window("z")  # cancel consumed no line; the name check catches the mismatch
    with pytest.raises(RuntimeError, match="Was expecting a, not z."):
        mon.end_window("z")


def test_name_check_can_be_disabled(log: Path) -> None:
    mon = ReplayZeusMonitor(log_file=log, match_window_name=False, ignore_sync_cuda=True)
    mon.begin_window("anything", sync_cuda=True)
    assert mon.end_window("anything").time == 2.5


def test_log_file_is_required() -> None:
    with pytest.raises(ValueError, match="log_file"):
        ReplayZeusMonitor()


def test_bad_header(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("start_time,window_name,elapsed_time,power\n")
    with pytest.raises(ValueError, match="power"):
        ReplayZeusMonitor(log_file=p)
