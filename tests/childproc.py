"""Child processes of tests: Python snippets run in a fresh interpreter, finishing a child
whose stdout a test has already read from, stopping one, and the address a `zeus-monitor
serve` child listens on."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import threading
from typing import IO, Any


def default_sigint() -> None:
    """`preexec_fn` for a child the test interrupts with SIGINT.

    A test runner started in the background (`cmd &` in a script) has SIGINT ignored, and its
    children inherit that, so Python would never raise `KeyboardInterrupt` in them.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ignore_sigint() -> None:
    """`preexec_fn` for a child started the way `nohup cmd &` starts a job: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[str, str]:
    """Wait for `proc` to end; return the rest of its stdout and stderr.

    `Popen.communicate()` reads the raw descriptors, so whatever an earlier `readline()` or
    `for line in proc.stdout` already pulled into the file object's buffer is lost to it: a
    line printed right after the one the test waited for can vanish. This reads through the
    same file objects instead, one thread per pipe so that neither can fill up and stall the
    child.
    """
    texts: dict[str, str] = {}

    def drain(name: str, stream: IO[str] | None) -> None:
        texts[name] = stream.read() if stream is not None else ""

    readers = [
        threading.Thread(target=drain, args=(name, stream), daemon=True)
        for name, stream in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    finally:
        for reader in readers:
            reader.join(timeout=timeout)
    return texts.get("out", ""), texts.get("err", "")


def served_address(proc: subprocess.Popen[str]) -> str:
    """The `host:port` a `zeus-monitor serve` child says it serves its metrics on.

    Reads the child's stderr up to the line with its `http://HOST:PORT/metrics` address; notes
    (no RAPL here, say) may come before it. Fails the test, with the lines read, if stderr
    ends first (the child died).
    """
    assert proc.stderr is not None
    seen: list[str] = []
    m = None
    while m is None and (line := proc.stderr.readline()):
        seen.append(line)
        m = re.search(r"http://(\S+)/metrics", line)
    assert m, seen
    return m.group(1)


def python_child(
    code: str, env: dict[str, str], timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run `code` (dedented) in a fresh interpreter with exactly `env`; its outcome."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_python(code: str, env: dict[str, str], timeout: float = 120.0) -> Any:
    """The JSON of the last line `python_child(code, env)` prints. Fails the test, with the
    child's stderr, if it exits non-zero."""
    out = python_child(code, env, timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_ranks(code: str, env: dict[str, str], world_size: int = 2, timeout: float = 240) -> list:
    """Run `code` (dedented) as ranks `0..world_size` at once, each given its rank and a free
    TCP port for `init_process_group` as `sys.argv[1:3]`; the JSON each prints after
    `RESULT `, in rank order. Fails the test, with the rank's stderr, if one exits non-zero."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(rank), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(world_size)
    ]
    results = []
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"rank {rank}: {err[-3000:]}"
        [line] = [x for x in out.splitlines() if x.startswith("RESULT ")]
        results.append(json.loads(line[len("RESULT ") :]))
    return results


def stop(proc: subprocess.Popen[Any], timeout: float = 20.0) -> int:
    """SIGTERM `proc` and wait for it (SIGKILL it if it has not ended in `timeout` s); its exit
    code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
