"""`python -m zeus.device journal|restore`, and the journal against what a hostile day brings:
unreadable entries, an unusable directory, reused pids, several holders of one GPU.

The simulator's state is per process, so the GPU is this test process's; the processes that
hold or held it are real (children that run, end normally, or are SIGKILLed), and their
entries are what those processes leave on disk.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import zeus.device.sim
from childproc import finish
from journal_files import entry_path, gone_pid, write_entry
from zeus import _core
from zeus.device.__main__ import main as device_cli
from zeus.device.settings import SettingsGuard, restore_stale


def test_journal_lists_both_kinds_and_restore_applies_them(
    sim_gpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = sim_gpus("A40,V100")
    state = tmp_path / "state"
    pid = gone_pid()
    write_entry(state, gpus.get_uuid(0), pid=pid, power_limit_mw=200_000)
    write_entry(state, gpus.get_uuid(1), pid=pid, gpu_clocks=True)
    assert device_cli(["--state-dir", str(state), "journal"]) == 0
    out = capsys.readouterr().out.splitlines()
    expected = {
        f"{gpus.get_uuid(0)}: original power limit 200000 mW (process {pid}, gone)",
        f"{gpus.get_uuid(1)}: GPU clocks locked (original: unlocked) (process {pid}, gone)",
    }
    assert set(out) == expected

    # Leave both GPUs changed in this process, as the dead one had.
    base1 = zeus.device.sim.steady_state(1)
    gpus.set_gpu_locked_clocks(1, 800, 800)
    assert zeus.device.sim.steady_state(1) != base1
    assert device_cli(["--state-dir", str(state), "restore"]) == 0
    out = capsys.readouterr().out
    assert f"GPU 0 ({gpus.get_uuid(0)}): restored power limit 200000 mW" in out
    assert f"GPU 1 ({gpus.get_uuid(1)}): unlocked GPU clocks" in out
    assert gpus.get_power_management_limit(0) == 200_000
    assert zeus.device.sim.steady_state(1) == base1
    assert _core.settings.journal_entries(state) == []


def test_restore_tries_every_gpu_and_exits_1_on_a_failure(
    sim_gpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = sim_gpus("A40,V100")
    state = tmp_path / "state"
    pid = gone_pid()
    # GPU 0's driver refuses every write: this restore fails.
    write_entry(state, gpus.get_uuid(0), pid=pid, power_limit_mw=150_000)
    write_entry(state, gpus.get_uuid(1), pid=pid, power_limit_mw=200_000)
    zeus.device.sim.inject_fault(0, "write", float("inf"), error="UNKNOWN")
    assert device_cli(["--state-dir", str(state), "restore"]) == 1
    captured = capsys.readouterr()
    assert "GPU 1" in captured.out and "restored power limit 200000 mW" in captured.out
    assert "GPU 0" in captured.err and "cannot restore power limit" in captured.err
    assert "simulated fault" in captured.err
    assert gpus.get_power_management_limit(1) == 200_000
    [left] = _core.settings.journal_entries(state)
    assert (left["uuid"], left["power_limit_mw"]) == (gpus.get_uuid(0), 150_000)


def test_an_original_outside_the_gpus_range_gives_the_driver_default(
    sim_gpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = sim_gpus("A40")
    state = tmp_path / "state"
    gpus.set_power_management_limit(0, 250_000)
    write_entry(state, gpus.get_uuid(0), pid=gone_pid(), power_limit_mw=5_000)
    assert device_cli(["--state-dir", str(state), "restore"]) == 0
    out = capsys.readouterr().out
    assert "set the default power limit 300000 mW" in out
    assert "the journaled 5000 mW is outside the GPU's range" in out
    assert gpus.get_power_management_limit(0) == 300_000
    assert _core.settings.journal_entries(state) == []


# The acceptance cases of the journal: in every one the GPU ends at its original limit after
# `python -m zeus.device restore` or the next optimizer start, and no traceback is printed.

ORIGINAL = 300_000  # the A40's default limit, in force when the simulator starts
LEFT_BEHIND = 180_000


def restore_by_cli(state: Path) -> tuple[int, str, str]:
    """`python -m zeus.device restore` in a child (for a real exit status and real output)
    and then the same in-process on this process's simulated GPU."""
    env = {**os.environ, "ZEUS_STATE_DIR": str(state), "ZEUS_SIM_GPUS": "A40"}
    env["ZEUS_GPU_BACKEND"] = "sim"
    listed = subprocess.run(
        [sys.executable, "-m", "zeus.device", "journal"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in listed.stderr, listed.stderr
    assert listed.returncode == 0, listed.stderr
    return device_cli(["--state-dir", str(state), "restore"]), listed.stdout, listed.stderr


def next_optimizer_start(gpus: Any, state: Path) -> None:
    """What a power-limit optimizer or frequency controller does first."""
    restore_stale(gpus, journal_dir=state)


@pytest.mark.parametrize("restorer", ["cli", "optimizer"])
@pytest.mark.parametrize(
    "content", ["", '{"uuid": "GPU-', "\n"], ids=["empty", "truncated", "blank"]
)
def test_an_unreadable_entry_is_moved_aside_and_the_gpu_gets_the_default(
    sim_gpus: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    restorer: str,
) -> None:
    gpus = sim_gpus("A40")
    state = tmp_path / "state"
    state.mkdir()
    path = entry_path(state, "power_limit", gpus.get_uuid(0))
    path.write_text(content)
    gpus.set_power_management_limit(0, LEFT_BEHIND)
    if restorer == "cli":
        rc, listing, _ = restore_by_cli(state)
        assert "unreadable power limit entry" in listing
        assert rc == 0
        out = capsys.readouterr()
        assert "Traceback" not in out.err
        assert "default power limit 300000 mW" in out.out and "moved aside" in out.out
    else:
        next_optimizer_start(gpus, state)
    assert gpus.get_power_management_limit(0) == ORIGINAL
    assert not path.exists()
    assert [p.name.split(".corrupt-")[0] for p in state.glob("*.corrupt-*")] == [path.name]
    # The GPU can be journaled again at once.
    guard = SettingsGuard(gpus, state)
    guard.set_power_limit(0, 200_000)
    assert [e["power_limit_mw"] for e in _core.settings.journal_entries(state)] == [ORIGINAL]
    guard.restore()


def test_an_unusable_journal_directory_is_one_line_not_a_traceback(
    sim_gpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = sim_gpus("A40")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    state = blocker / "state"  # can never be created
    env = {**os.environ, "ZEUS_GPU_BACKEND": "sim", "ZEUS_STATE_DIR": str(state)}
    for command in ("journal", "restore"):
        proc = subprocess.run(
            [sys.executable, "-m", "zeus.device", command],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
    # A directory that exists but cannot be listed.
    locked = tmp_path / "locked"
    locked.mkdir()
    write_entry(locked, gpus.get_uuid(0), pid=gone_pid(), power_limit_mw=200_000)
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as root: permissions do not stop this process")
        rc = device_cli(["--state-dir", str(locked), "journal"])
        err = capsys.readouterr().err
        assert rc == 1 and len(err.splitlines()) == 2, err
        assert "error: cannot use the journal" in err and "Traceback" not in err
    finally:
        locked.chmod(0o755)


def test_a_reused_pid_does_not_keep_a_dead_owners_limit(
    sim_gpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = sim_gpus("A40")
    state = tmp_path / "state"
    # The owner is gone; an unrelated process runs under its pid now (started later).
    unrelated = subprocess.Popen(["sleep", "60"])
    try:
        stat = Path(f"/proc/{unrelated.pid}/stat").read_text()
        start = int(stat[stat.rindex(")") + 2 :].split()[19])
        owner = {"pid": unrelated.pid, "start_time": start - 500}
        write_entry(state, gpus.get_uuid(0), holders=[owner], power_limit_mw=ORIGINAL)
        gpus.set_power_management_limit(0, LEFT_BEHIND)
        rc, listing, _ = restore_by_cli(state)
        assert f"process {unrelated.pid}, gone" in listing
        assert rc == 0
        assert "restored power limit 300000 mW" in capsys.readouterr().out
        assert gpus.get_power_management_limit(0) == ORIGINAL
        assert _core.settings.journal_entries(state) == []
    finally:
        unrelated.kill()
        unrelated.wait()


HOLDER = textwrap.dedent(
    """
    import sys, time
    print("READY", flush=True)
    sys.stdin.readline()
    """
)


def start_holder() -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


@pytest.mark.parametrize("restorer", ["cli", "optimizer"])
def test_two_holders_the_first_exits_cleanly_the_second_is_sigkilled(
    sim_gpus: Any, tmp_path: Path, restorer: str
) -> None:
    gpus = sim_gpus("A40")
    state = tmp_path / "state"
    a, b = start_holder(), start_holder()
    # A and B change the GPU, each through a guard that holds the setting on its behalf.
    guard_a = SettingsGuard(gpus, state, owner_pid=a.pid)
    guard_a.set_power_limit(0, 200_000)
    guard_b = SettingsGuard(gpus, state, owner_pid=b.pid)
    guard_b.set_power_limit(0, 150_000)
    [entry] = _core.settings.journal_entries(state)
    assert entry["power_limit_mw"] == ORIGINAL
    assert [h["pid"] for h in entry["holders"]] == [a.pid, b.pid]

    # A exits cleanly: it releases, B still runs, so B's limit stays and so does the entry.
    assert guard_a.restore() == [f"GPU 0: power limit left as running process(es) {b.pid} set it"]
    assert a.stdin is not None
    a.stdin.write("\n")
    a.stdin.flush()
    finish(a)
    assert gpus.get_power_management_limit(0) == 150_000
    [entry] = _core.settings.journal_entries(state)
    assert [h["pid"] for h in entry["holders"]] == [b.pid]

    # B is SIGKILLed: nothing of it runs to restore.
    b.send_signal(signal.SIGKILL)
    finish(b)
    if restorer == "cli":
        rc, listing, _ = restore_by_cli(state)
        assert f"process {b.pid}, gone" in listing and rc == 0
    else:
        next_optimizer_start(gpus, state)
    assert gpus.get_power_management_limit(0) == ORIGINAL
    assert _core.settings.journal_entries(state) == []
    # B's guard object lives here only because the simulator is per process; releasing it finds
    # the entry gone and just applies the original again.
    assert guard_b.restore() == [f"GPU 0: restored power limit {ORIGINAL} mW"]
