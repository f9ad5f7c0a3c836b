"""`scripts/test` says what it is doing: each step's start, its end and its seconds, and a line
every `ZEUS_TEST_HEARTBEAT_S` seconds while a quiet step (the install) runs.

The script runs on stand-in `python3` and `cargo` commands that record their arguments; the
install's stand-in runs until the test lets it finish.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest
from childproc import default_sigint, finish

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test"
INSTALL = "installing zeus (editable; compiles the Rust core) with its test dependencies"
BUILD = "building the simulated libnvidia-ml, zeus-monitor and zeusd"

PYTHON3 = """#!/usr/bin/env bash
echo "python3 $*" >> "$STUB_LOG"
if [ "$2" = pip ]; then
    while [ ! -e "$STUB_RELEASE" ]; do sleep 0.05; done
fi
"""
CARGO = """#!/usr/bin/env bash
echo "cargo $*" >> "$STUB_LOG"
if [ "$1" = test ]; then exit "${STUB_CARGO_TEST_STATUS:-0}"; fi
"""


class Run:
    """`scripts/test` on the stand-ins, its stdout read line by line as it comes."""

    def __init__(self, tmp: Path, *args: str, **env: str) -> None:
        repo = tmp / "repo"
        (repo / "scripts").mkdir(parents=True)
        shutil.copy(SCRIPT, repo / "scripts" / "test")
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for name, text in (("python3", PYTHON3), ("cargo", CARGO)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        self.log = tmp / "calls.log"
        self.release = tmp / "release"
        self.proc = subprocess.Popen(
            ["bash", str(repo / "scripts" / "test"), *args],
            env={
                **os.environ,
                "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                "STUB_LOG": str(self.log),
                "STUB_RELEASE": str(self.release),
                "ZEUS_TEST_HEARTBEAT_S": "1",
                **env,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, as a terminal's job is
            preexec_fn=default_sigint,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> str:
        """The first line from now on matching `pattern`."""
        while True:
            line = self._queue.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"no line matched {pattern!r}; output: {self.lines}")
            self.lines.append(line)
            if re.search(pattern, line):
                return line

    def finish(self, timeout: float = 60.0) -> tuple[int, str, str]:
        """Exit status, the whole stdout and stderr, once every holder of stdout is gone."""
        self._reader.join(timeout=timeout)
        if self._reader.is_alive():
            self.kill()
            raise AssertionError(f"stdout still open after the script: {self.lines}")
        while (line := self._queue.get_nowait()) is not None:
            self.lines.append(line)
        _, err = finish(self.proc, timeout=timeout)
        return self.proc.returncode, "\n".join(self.lines), err

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def kill(self) -> None:
        """End whatever of the run is left (its own process group)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """`start(*args, **env)` runs the script; what a failed test leaves running is ended."""
    runs: list[Run] = []

    def make(*args: str, **env: str) -> Run:
        runs.append(Run(tmp_path, *args, **env))
        return runs[-1]

    yield make
    for run in runs:
        run.kill()
        run.proc.wait(timeout=30)


def test_each_step_is_announced_and_timed_and_the_install_says_it_runs(
    start: Callable[..., Run],
) -> None:
    run = start("-k", "some tests")
    run.wait_for(rf"^== {re.escape(INSTALL)} \(\d\d:\d\d:\d\d\)$")
    run.wait_for(rf"^   \.\.\. {re.escape(INSTALL)}: still running after [1-9]\d* s$")
    run.release.touch()
    status, out, err = run.finish()
    assert status == 0, out + err
    steps = [INSTALL, BUILD, "Rust tests", "Python tests"]
    starts = [re.escape(s) + r" \(\d\d:\d\d:\d\d\)" for s in steps]
    ends = [re.escape(s) + r": done in \d+ s" for s in steps]
    announced = [line for line in out.splitlines() if line.startswith("== ")]
    expected = [f"== {p}" for pair in zip(starts, ends) for p in pair]
    assert len(announced) == len(expected), out
    for line, pattern in zip(announced, expected):
        assert re.fullmatch(pattern, line), (line, pattern)
    install_done = next(line for line in announced if line.startswith(f"== {INSTALL}: done"))
    assert int(install_done.split()[-2]) >= 1  # it ran past at least one heartbeat
    assert run.calls() == [
        "python3 -m pip install --quiet --disable-pip-version-check -e .[test]",
        "cargo build --quiet -p zeus-sim-nvml -p zeus-monitor -p zeusd",
        "cargo test --workspace",
        "python3 -m pytest -k some tests",
    ]


def test_a_failing_step_ends_the_script_with_its_status(
    start: Callable[..., Run], tmp_path: Path
) -> None:
    (tmp_path / "release").touch()  # the install returns at once
    run = start(STUB_CARGO_TEST_STATUS="3")
    status, out, err = run.finish()
    assert status == 3, out + err
    assert re.search(r"^== Rust tests: failed \(exit status 3\) after \d+ s$", out, re.M), out
    assert "Python tests" not in out
    assert not any("pytest" in call for call in run.calls())


def test_a_script_killed_during_the_install_leaves_no_heartbeat_behind(
    start: Callable[..., Run],
) -> None:
    run = start()
    run.wait_for(r"still running after")
    os.kill(run.proc.pid, signal.SIGTERM)  # the script alone, as a CI timeout may
    assert run.proc.wait(timeout=30) == -signal.SIGTERM
    run.release.touch()  # the install's stand-in, orphaned, ends too
    # The heartbeat writes to the same stdout: the output ends only once it is gone.
    _, out, _ = run.finish(timeout=30)
    assert "done in" not in out and "Rust tests" not in out


def test_a_bad_heartbeat_period_is_refused(start: Callable[..., Run]) -> None:
    run = start(ZEUS_TEST_HEARTBEAT_S="0.5")
    status, out, err = run.finish()
    assert status == 2
    assert "ZEUS_TEST_HEARTBEAT_S must be a whole number of seconds > 0" in err
    assert run.calls() == []
