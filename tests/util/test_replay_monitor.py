"""zeus.util.testing.ReplayZeusMonitor."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from childproc import run_python
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


def test_zeus016_keywords(log: Path) -> None:
    """Zeus 0.16 code: `ignore_sync_execution=`, `approx_instant_energy=`, `sync_execution=`
    and `begin_window(..., restart=True)`."""
    mon = ReplayZeusMonitor(log_file=log, ignore_sync_execution=True, approx_instant_energy=True)
    assert mon.ignore_sync_execution is True and mon.ignore_sync_cuda is True
    assert mon.approx_instant_energy is True
    mon.begin_window("a", sync_execution=False)
    mon.begin_window("a", sync_execution=False, restart=True)  # open again, no error
    m = mon.end_window("a", sync_execution=False)
    assert (m.time, m.gpu_energy) == (2.5, {0: 10.0, 2: 20.0})
    assert ReplayZeusMonitor(log_file=log).ignore_sync_execution is False
    with pytest.raises(ValueError, match="ignore_sync_cuda=False and ignore_sync_execution=True"):
        ReplayZeusMonitor(log_file=log, ignore_sync_cuda=False, ignore_sync_execution=True)


def _write_log(path: Path, gpu_indices: list[int], cpu_indices: list[int]) -> None:
    """Two windows logged by this package's `ZeusMonitor` in a fresh interpreter (the simulated
    CPUs are set up once per process)."""
    run_python(
        f"""
        import time
        from zeus.monitor import ZeusMonitor
        m = ZeusMonitor(gpu_indices={gpu_indices!r}, cpu_indices={cpu_indices!r},
                        log_file={str(path)!r})
        for name in ("a", "b"):
            m.begin_window(name, sync_cuda=False)
            time.sleep(0.05)
            m.end_window(name, sync_cuda=False)
        print("{{}}")
        """,
        {**os.environ, "ZEUS_GPU_BACKEND": "sim", "ZEUS_SIM_GPUS": "A40", "ZEUS_SIM_CPUS": "1"},
    )


def test_a_log_with_cpu_and_dram_columns_replays(tmp_path: Path) -> None:
    log = tmp_path / "cpu.csv"
    _write_log(log, [0], [0])
    rows = list(csv.reader(log.open()))
    assert rows[0][3:6] == ["gpu0_energy", "cpu0_energy", "dram0_energy"]
    mon = ReplayZeusMonitor(log_file=log)
    assert mon.gpu_indices == [0] and mon.cpu_indices == [0]
    for row in rows[1:]:
        mon.begin_window(row[1])
        m = mon.end_window(row[1])
        assert m.time == float(row[2])
        assert m.gpu_energy == {0: float(row[3])}
        assert m.cpu_energy == {0: float(row[4])} and m.dram_energy == {0: float(row[5])}
        assert m.total_energy == pytest.approx(sum(float(x) for x in row[3:6]))
        assert m.gpu_energy_uncertainty == {0: float(row[6])}
    mon.begin_window("c")
    cancelled = mon.end_window("c", cancel=True)
    assert cancelled.cpu_energy == {0: 0.0} and cancelled.dram_energy == {0: 0.0}


def test_a_cpu_only_log_replays(tmp_path: Path) -> None:
    log = tmp_path / "cpu_only.csv"
    _write_log(log, [], [0])
    rows = list(csv.reader(log.open()))
    assert not any(c.startswith("gpu") for c in rows[0])
    mon = ReplayZeusMonitor(log_file=log)
    assert mon.gpu_indices == [] and mon.cpu_indices == [0]
    mon.begin_window("a")
    m = mon.end_window("a")
    assert m.gpu_energy == {} and m.cpu_energy == {0: float(rows[1][3])}


def test_a_zeus016_gpu_only_log_replays(tmp_path: Path) -> None:
    """Zeus 0.16's `ZeusMonitor` writes GPU columns only, without bounds."""
    log = tmp_path / "zeus016.csv"
    log.write_text("start_time,window_name,elapsed_time,gpu0_energy\n1.0,step,0.5,42.0\n")
    mon = ReplayZeusMonitor(log_file=log)
    assert mon.cpu_indices is None
    mon.begin_window("step")
    m = mon.end_window("step")
    assert (m.time, m.gpu_energy, m.cpu_energy) == (0.5, {0: 42.0}, None)
