"""`zeus-monitor --restore`: undoes the journaled GPU changes of zeus processes that are gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from journal_files import entry_path, gone_pid, write_entry
from zeus import _core

REPO = Path(__file__).resolve().parents[2]

# A zeus process that changes GPU 0's power limit (250 W before it) and clock locks, then is
# killed with SIGKILL, leaving its journal entries behind.
CHILD = textwrap.dedent(
    """
    import os, signal
    from zeus.device import get_gpus
    from zeus.device.settings import SettingsGuard
    gpus = get_gpus()
    gpus.set_power_management_limit(0, 250_000)
    guard = SettingsGuard(gpus)
    guard.set_power_limit(0, 200_000)
    guard.lock_memory_clocks(0, 5001, 5001)
    guard.lock_gpu_clocks(0, 900, 900)
    print(os.getpid(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.fixture
def restore_bin() -> Path:
    """A zeus-monitor build that knows --restore (python/zeus/_bin may be an older copy)."""
    for cand in (
        REPO / "target" / "debug" / "zeus-monitor",
        REPO / "python" / "zeus" / "_bin" / "zeus-monitor",
    ):
        if cand.is_file():
            helped = subprocess.run([cand, "--help"], capture_output=True, text=True, timeout=60)
            if "--restore" in helped.stdout:
                return cand
    pytest.skip("no zeus-monitor with --restore is built (cargo build -p zeus-monitor)")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ZEUS_GPU_BACKEND": "sim",
        "ZEUS_SIM_GPUS": "A40,V100",
        "ZEUS_SIM_CLOCK": "virtual",
        "ZEUS_STATE_DIR": str(tmp_path / "state"),
    }


def dead_process_journals(env: dict[str, str]) -> int:
    child = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    return int(child.stdout)


def uuid(env: dict[str, str], index: int) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from zeus.device import get_gpus; print(get_gpus().get_uuid({index}))",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip()


def test_restore_undoes_every_kind_and_prints_one_line_per_gpu(
    restore_bin: Path, env: dict[str, str]
) -> None:
    pid = dead_process_journals(env)
    state = Path(env["ZEUS_STATE_DIR"])
    assert {e["kind"] for e in _core.settings.journal_entries(state)} == {"power_limit", "clocks"}
    # An entry of a process that still runs (this one) is left alone.
    write_entry(state, uuid(env, 1), pid=os.getpid(), gpu_clocks=True)

    proc = subprocess.run(
        [restore_bin, "--restore"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"GPU 0 ({uuid(env, 0)}): restored power limit 250000 mW (journaled by process {pid})",
        f"GPU 0 ({uuid(env, 0)}): unlocked GPU and memory clocks (journaled by process {pid})",
    ]
    [left] = _core.settings.journal_entries(state)
    assert (left["uuid"], left["pid"]) == (uuid(env, 1), os.getpid())

    entry_path(state, "clocks", uuid(env, 1)).unlink()
    again = subprocess.run(
        [restore_bin, "--restore"], env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and again.stdout == ""
    assert "Nothing to restore" in again.stderr


def test_a_failing_gpu_does_not_stop_the_others_and_exits_1(
    restore_bin: Path, env: dict[str, str]
) -> None:
    dead_process_journals(env)
    state = Path(env["ZEUS_STATE_DIR"])
    # GPU 1's driver refuses every write: its restore fails, GPU 0's still happens.
    write_entry(state, uuid(env, 1), pid=gone_pid(), power_limit_mw=150_000)
    proc = subprocess.run(
        [restore_bin, "--restore"],
        env={**env, "ZEUS_SIM_FAULTS": "1:write@0+inf=UNKNOWN"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert all(line.startswith("GPU 0 (") for line in proc.stdout.splitlines())
    assert len(proc.stdout.splitlines()) == 2
    assert "GPU 1" in proc.stderr and "cannot restore power limit" in proc.stderr
    [left] = _core.settings.journal_entries(state)
    assert (left["kind"], left["uuid"], left["power_limit_mw"]) == (
        "power_limit",
        uuid(env, 1),
        150_000,
    )


def test_restore_takes_no_logging_arguments(restore_bin: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(
        [restore_bin, "--restore", "out.csv", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--restore" in proc.stderr
