"""FrequencyController's clock journal: SIGKILL leaves an entry that later processes undo."""

from __future__ import annotations

import logging
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
from zeus import _core
from zeus.device.__main__ import main as device_cli
from zeus.optimizer.perseus.frequency_controller import FrequencyController

CHILD = textwrap.dedent(
    """
    import os, sys, time
    from zeus.optimizer.perseus.frequency_controller import FrequencyController
    c = FrequencyController(int(sys.argv[1]))
    c.set_frequency(900)
    c.wait()
    print("READY", os.getpid(), flush=True)
    time.sleep(60)
    """
)


def spawn_and_kill(device_id: int) -> int:
    """Run a controller on simulated GPU `device_id` in a child, SIGKILL it; returns its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(device_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ZEUS_LOG_LEVEL": "WARNING"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY"), proc.stderr.read() if proc.stderr else ""
    proc.kill()
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    return int(line.split()[1])


def lock_own_clocks(gpus: Any, index: int) -> None:
    """Lock this process's simulated GPU the way a controller would have (simulator state is
    per process, so the killed child's locks are not visible here)."""
    gpus.set_memory_locked_clocks(index, 405, 405)
    gpus.set_gpu_locked_clocks(index, 900, 900)


def test_sigkill_leaves_a_clock_entry_that_the_cli_restores(
    sim_gpus: Any, journal_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = sim_gpus("A40")
    base = zeus.device.sim.steady_state(0)
    child = spawn_and_kill(0)

    [entry] = _core.settings.journal_entries(journal_dir)
    assert entry["kind"] == "clocks"
    assert (entry["uuid"], entry["pid"]) == (gpus.get_uuid(0), child)
    assert entry["gpu_clocks"] and entry["memory_clocks"]

    listing = subprocess.run(
        [sys.executable, "-m", "zeus.device", "journal"], capture_output=True, text=True
    )
    assert listing.returncode == 0, listing.stderr
    assert "GPU and memory clocks locked" in listing.stdout
    assert f"process {child}, gone" in listing.stdout

    lock_own_clocks(gpus, 0)
    assert zeus.device.sim.steady_state(0) != base
    capsys.readouterr()
    assert device_cli(["restore"]) == 0
    out = capsys.readouterr().out
    assert f"unlocked GPU and memory clocks (journaled by process {child})" in out
    assert zeus.device.sim.steady_state(0) == base
    assert _core.settings.journal_entries(journal_dir) == []


def test_cli_restore_in_a_fresh_process_clears_the_clock_entry(
    sim_gpus: Any, journal_dir: Path
) -> None:
    gpus = sim_gpus("A40")
    child = spawn_and_kill(0)
    assert len(_core.settings.journal_entries(journal_dir)) == 1
    cli = subprocess.run(
        [sys.executable, "-m", "zeus.device", "restore"], capture_output=True, text=True
    )
    assert cli.returncode == 0, cli.stderr
    assert (
        f"GPU 0 ({gpus.get_uuid(0)}): unlocked GPU and memory clocks (journaled by process {child})"
    ) in cli.stdout
    assert _core.settings.journal_entries(journal_dir) == []
    again = subprocess.run(
        [sys.executable, "-m", "zeus.device", "restore"], capture_output=True, text=True
    )
    assert again.returncode == 0 and "Nothing to restore" in again.stdout


def test_a_new_controller_restores_a_killed_controllers_clocks(
    sim_gpus: Any, journal_dir: Path
) -> None:
    # The killed run used the A40 (GPU 1); the new controller runs on the V100 (GPU 0), so the
    # A40's state shows the restore alone and not the new controller's own locking.
    gpus = sim_gpus("V100,A40")
    base = zeus.device.sim.steady_state(1)
    child = spawn_and_kill(1)
    [stale] = _core.settings.journal_entries(journal_dir)
    assert (stale["uuid"], stale["pid"]) == (gpus.get_uuid(1), child)

    lock_own_clocks(gpus, 1)
    assert zeus.device.sim.steady_state(1) != base
    c = FrequencyController(0, gpus)
    try:
        assert zeus.device.sim.steady_state(1) == base
        [entry] = _core.settings.journal_entries(journal_dir)
        assert (entry["kind"], entry["uuid"], entry["pid"]) == (
            "clocks",
            gpus.get_uuid(0),
            os.getpid(),
        )
    finally:
        c.end()
    assert _core.settings.journal_entries(journal_dir) == []


def test_journals_before_the_first_change_and_clears_after_reset(
    sim_gpus: Any, journal_dir: Path
) -> None:
    gpus = sim_gpus("A40")
    base = zeus.device.sim.steady_state(0)
    with FrequencyController(0, gpus) as c:
        # Journaled as this process's before the locks at the maxima.
        [entry] = _core.settings.journal_entries(journal_dir)
        assert entry["kind"] == "clocks" and entry["pid"] == os.getpid()
        assert entry["gpu_clocks"] and entry["memory_clocks"]
        c.set_frequency(900)
        assert c.wait(timeout=5)
        assert zeus.device.sim.steady_state(0) != base
        assert _core.settings.journal_entries(journal_dir) == [entry]
    assert _core.settings.journal_entries(journal_dir) == []
    assert zeus.device.sim.steady_state(0) == base


def test_a_failed_reset_is_logged_and_keeps_the_entry(
    sim_gpus: Any, journal_dir: Path, caplog: Any
) -> None:
    gpus = sim_gpus("A40")
    c = FrequencyController(0, gpus)

    class BrokenRestore:
        def __init__(self, guard: Any) -> None:
            self.guard = guard

        def __getattr__(self, name: str) -> Any:
            return getattr(self.guard, name)

        def restore(self) -> list[str]:
            raise RuntimeError("driver went away")

    real_guard = c._guard
    c._guard = BrokenRestore(real_guard)
    with caplog.at_level(logging.WARNING):
        c.end()  # an exit path: reports, never raises
    assert "Restoring GPU 0 clocks failed: driver went away" in caplog.text
    [entry] = _core.settings.journal_entries(journal_dir)
    assert entry["kind"] == "clocks" and entry["pid"] == os.getpid()
    # This process still holds it: only an explicit restore of held settings takes it.
    assert device_cli(["restore"]) == 0
    assert len(_core.settings.journal_entries(journal_dir)) == 1
    assert device_cli(["restore", "--all"]) == 0
    assert _core.settings.journal_entries(journal_dir) == []
    real_guard.restore()


def test_unwritable_journal_warns_and_still_resets(
    sim_gpus: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("ZEUS_STATE_DIR", str(blocker / "state"))
    gpus = sim_gpus("A40")
    base = zeus.device.sim.steady_state(0)
    with caplog.at_level(logging.WARNING), FrequencyController(0, gpus) as c:
        c.set_frequency(900)
        assert c.wait(timeout=5)
        assert zeus.device.sim.steady_state(0) != base
    assert "cannot journal GPU 0's original clock locks" in caplog.text
    assert zeus.device.sim.steady_state(0) == base
