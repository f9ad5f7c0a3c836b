"""`python -m zeus.device journal|restore` over both kinds of journal entry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zeus.sim
from zeus import _core
from zeus.device.__main__ import main as device_cli


def journal_in_a_dead_process(state: Path, code: str) -> int:
    """Run `code` (with `_core`, `gpus` and `state` defined) in a child that then exits."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys\nfrom zeus import _core\nfrom zeus.device import get_gpus\n"
            f"gpus = get_gpus()\nstate = {str(state)!r}\n{code}\nprint(os.getpid())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    return int(child.stdout)


def test_journal_lists_both_kinds_and_restore_applies_them(
    sim_gpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = sim_gpus("A40,V100")
    state = tmp_path / "state"
    pid = journal_in_a_dead_process(
        state,
        "_core.journal_record(gpus.get_uuid(0), 200_000, state)\n"
        "_core.journal_record_clocks(gpus.get_uuid(1), True, False, state)",
    )
    assert device_cli(["--state-dir", str(state), "journal"]) == 0
    out = capsys.readouterr().out.splitlines()
    expected = {
        f"{gpus.get_uuid(0)}: original power limit 200000 mW (process {pid}, gone)",
        f"{gpus.get_uuid(1)}: GPU clocks locked (original: unlocked) (process {pid}, gone)",
    }
    assert set(out) == expected

    # Leave both GPUs changed in this process, as the dead one had.
    base1 = zeus.sim.steady_state(1)
    gpus.set_gpu_locked_clocks(1, 800, 800)
    assert zeus.sim.steady_state(1) != base1
    assert device_cli(["--state-dir", str(state), "restore"]) == 0
    out = capsys.readouterr().out
    assert f"GPU 0 ({gpus.get_uuid(0)}): restored power limit 200000 mW" in out
    assert f"GPU 1 ({gpus.get_uuid(1)}): unlocked GPU clocks" in out
    assert gpus.get_power_management_limit(0) == 200_000
    assert zeus.sim.steady_state(1) == base1
    assert _core.journal_entries(state) == []


def test_restore_tries_every_gpu_and_exits_1_on_a_failure(
    sim_gpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = sim_gpus("A40,V100")
    state = tmp_path / "state"
    journal_in_a_dead_process(
        state,
        # Out of the A40's range: this restore fails.
        "_core.journal_record(gpus.get_uuid(0), 5_000, state)\n"
        "_core.journal_record(gpus.get_uuid(1), 200_000, state)",
    )
    assert device_cli(["--state-dir", str(state), "restore"]) == 1
    captured = capsys.readouterr()
    assert "GPU 1" in captured.out and "restored power limit 200000 mW" in captured.out
    assert "GPU 0" in captured.err and "cannot restore power limit" in captured.err
    assert "5000" in captured.err
    assert gpus.get_power_management_limit(1) == 200_000
    [left] = _core.journal_entries(state)
    assert (left["uuid"], left["power_limit_mw"]) == (gpus.get_uuid(0), 5_000)
