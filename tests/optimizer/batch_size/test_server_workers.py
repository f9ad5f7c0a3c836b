"""`zeus-bso-server --workers N`: the worker processes die with their supervisor, even when it
is SIGKILLed, so a restart can bind the port again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _wait(cond, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_workers_die_with_a_sigkilled_supervisor(tmp_path: Path) -> None:
    port = _free_port()
    db = f"sqlite+aiosqlite:///{tmp_path / 'bso.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_BSO_")}
    cmd = [
        sys.executable,
        "-m",
        "zeus.optimizer.batch_size.server.cli",
        "serve",
        "--port",
        str(port),
        "--workers",
        "2",
        "--database-url",
        db,
    ]
    subprocess.run([*cmd[:3], "migrate", "--database-url", db], env=env, check=True, timeout=120)
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait(lambda: _answers(port), 60, "the server never listened")
        first.send_signal(signal.SIGKILL)
        first.wait()
        # The workers go too: nothing answers on the port any more.
        _wait(lambda: not _answers(port), 20, "workers still serve after the supervisor died")
        second = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait(lambda: _answers(port), 60, "a restart could not listen")
            assert second.poll() is None
        finally:
            second.terminate()
            second.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
