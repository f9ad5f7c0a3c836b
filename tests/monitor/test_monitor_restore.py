"""`zeus-monitor --restore`: undoes the journaled GPU changes of zeus processes that are gone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from zeus import _core

REPO = Path(__file__).resolve().parents[2]

# A zeus process that journals GPU 0's power limit and clock locks (and, with an argument, an
# impossible power limit for GPU 1), then dies without restoring anything.
CHILD = textwrap.dedent(
    """
    import os, sys
    from zeus import _core
    from zeus.device import get_gpus
    gpus = get_gpus()
    _core.journal_record(gpus.get_uuid(0), 250_000)
    _core.journal_record_clocks(gpus.get_uuid(0), True, True)
    if len(sys.argv) > 1:
        _core.journal_record(gpus.get_uuid(1), 5_000)
    print(os.getpid(), flush=True)
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
    pytest.skip("no zeus-monitor with --restore is built (cargo build -p zeus-cli)")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ZEUS_GPU_BACKEND": "sim",
        "ZEUS_SIM_GPUS": "A40,V100",
        "ZEUS_SIM_CLOCK": "virtual",
        "ZEUS_STATE_DIR": str(tmp_path / "state"),
    }


def dead_process_journals(env: dict[str, str], *args: str) -> int:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr
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
    assert {e["kind"] for e in _core.journal_entries(state)} == {"power_limit", "clocks"}
    # An entry of a process that still runs (this one) is left alone.
    _core.journal_record_clocks(uuid(env, 1), True, False, state)

    proc = subprocess.run(
        [restore_bin, "--restore"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"GPU 0 ({uuid(env, 0)}): restored power limit 250000 mW (journaled by process {pid}); "
        f"unlocked GPU and memory clocks (journaled by process {pid})"
    ]
    [left] = _core.journal_entries(state)
    assert (left["uuid"], left["pid"]) == (uuid(env, 1), os.getpid())

    _core.journal_clear_clocks(uuid(env, 1), state)
    again = subprocess.run(
        [restore_bin, "--restore"], env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and again.stdout == ""
    assert "Nothing to restore" in again.stderr


def test_a_failing_gpu_does_not_stop_the_others_and_exits_1(
    restore_bin: Path, env: dict[str, str]
) -> None:
    dead_process_journals(env, "with-bad-gpu-1")
    state = Path(env["ZEUS_STATE_DIR"])
    proc = subprocess.run(
        [restore_bin, "--restore"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stdout.startswith("GPU 0 (") and len(proc.stdout.splitlines()) == 1
    assert "GPU 1" in proc.stderr and "cannot restore power limit" in proc.stderr
    [left] = _core.journal_entries(state)
    assert (left["kind"], left["uuid"], left["power_limit_mw"]) == (
        "power_limit",
        uuid(env, 1),
        5_000,
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
