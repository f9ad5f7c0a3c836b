"""FrequencyController: applies clocks off-thread, coalesces, restores on every exit path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import zeus.device.sim
from childproc import default_sigint, finish
from zeus import _core
from zeus.optimizer.perseus.frequency_controller import FrequencyController


def test_applies_and_restores(sim_gpus):
    gpus = sim_gpus("A40")
    base = zeus.device.sim.steady_state(0)
    with FrequencyController(0, gpus) as c:
        assert c.frequency == c.max_frequency == 1740
        c.set_frequency(975)
        assert c.wait(timeout=5)
        assert c.frequency == 975
        slow = zeus.device.sim.steady_state(0)
        assert slow[0] > base[0] * 1.5 and slow[1] < base[1]
        c.set_frequency(0)  # ignored, like the reference
        assert c.wait(timeout=5) and c.frequency == 975
    assert zeus.device.sim.steady_state(0) == base
    with pytest.raises(RuntimeError, match="ended"):
        c.set_frequency(1000)
    c.end()  # idempotent


def test_coalesces_to_latest_request(sim_gpus):
    gpus = sim_gpus("A40")
    calls = []

    class Counting:
        def __init__(self, guard):
            self.guard = guard

        def __getattr__(self, name):
            return getattr(self.guard, name)

        def lock_gpu_clocks(self, i, lo, hi):
            calls.append(lo)
            time.sleep(0.01)  # a slow driver call, so requests pile up meanwhile
            self.guard.lock_gpu_clocks(i, lo, hi)

    with FrequencyController(0, gpus) as c:
        c._guard = Counting(c._guard)
        for f in range(1000, 1100, 5):
            c.set_frequency(f)
        assert c.wait(timeout=5)
        assert c.frequency == 1095
        assert calls[-1] == 1095
        # Superseded requests were dropped rather than applied one by one.
        assert len(calls) < 20


def test_errors_surface_through_wait(sim_gpus):
    gpus = sim_gpus("A40")

    class Failing:
        def __init__(self, guard):
            self.guard = guard

        def __getattr__(self, name):
            return getattr(self.guard, name)

        def lock_gpu_clocks(self, i, lo, hi):
            if lo == 1234:
                raise ValueError(f"cannot lock {lo} MHz")
            self.guard.lock_gpu_clocks(i, lo, hi)

    with FrequencyController(0, gpus) as c:
        c._guard = Failing(c._guard)
        c.set_frequency(1234)
        with pytest.raises(ValueError, match="1234"):
            c.wait(timeout=5)
        # The controller keeps working after a failed change.
        c.set_frequency(900)
        assert c.wait(timeout=5) and c.frequency == 900


CHILD = textwrap.dedent(
    """
    import atexit, os, signal, sys, time
    os.environ.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_CLOCK="virtual")
    import zeus.device.sim
    from zeus.device import get_gpus
    from zeus.optimizer.perseus.frequency_controller import FrequencyController
    from zeus.util import signals
    gpus = get_gpus()
    base = zeus.device.sim.steady_state(0)

    def show(when):
        state = "UNLOCKED" if zeus.device.sim.steady_state(0) == base else "LOCKED"
        print(state, when, flush=True)

    # Runs after the controller's reset: exit hooks run last-in first-out, signal cleanups in
    # the order they were added.
    atexit.register(show, "exit")
    c = FrequencyController(0, gpus)
    signals.run_before(signal.SIGTERM, lambda: show("sigterm"))
    c.set_frequency(900)
    c.wait()
    print("READY", flush=True)
    mode = sys.argv[1]
    if mode == "exception":
        raise ValueError("training crashed")
    if mode == "normal":
        sys.exit(0)
    if mode == "ask":
        sys.stdin.readline()
        show("alive")
    time.sleep(60)
    """
)


@pytest.mark.parametrize(
    "mode,sig,code",
    [
        ("normal", None, 0),
        ("exception", None, 1),
        ("wait", signal.SIGTERM, -signal.SIGTERM),
        ("wait", signal.SIGINT, -signal.SIGINT),  # KeyboardInterrupt, then atexit
    ],
)
def test_clocks_restored_on_exit_paths(mode, sig, code, journal_dir):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ZEUS_LOG_LEVEL": "WARNING"},
        preexec_fn=default_sigint,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", proc.stderr.read() if proc.stderr else ""
    if sig is not None:
        proc.send_signal(sig)
    # The normal exit prints right after READY: readline() may already hold it.
    out, err = finish(proc)
    assert proc.returncode == code, err
    states = [line for line in out.splitlines() if "LOCKED" in line]
    assert states and all(line.startswith("UNLOCKED") for line in states), (out, err)
    # The child journaled its locks ($ZEUS_STATE_DIR is inherited) and cleared them on reset.
    assert journal_dir.is_dir()
    assert _core.settings.journal_entries(journal_dir) == []


def ignore_sigterm() -> None:
    default_sigint()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def test_an_ignored_sigterm_keeps_the_clocks_locked(journal_dir):
    # A job started with SIGTERM ignored does not end on it: the plan's clocks must stay.
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "ask"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ZEUS_LOG_LEVEL": "WARNING"},
        preexec_fn=ignore_sigterm,
    )
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY", proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGTERM)
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "LOCKED alive"  # the SIGTERM reset nothing
    assert len(_core.settings.journal_entries(journal_dir)) == 1
    proc.send_signal(signal.SIGINT)  # KeyboardInterrupt, then the reset at exit
    out, err = finish(proc)
    assert proc.returncode == -signal.SIGINT, err
    assert out.splitlines() == ["UNLOCKED exit"], (out, err)
    assert _core.settings.journal_entries(journal_dir) == []
