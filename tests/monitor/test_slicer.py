"""`zeus.monitor.slicer`: one thread runs every periodic cut and reading."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import pytest
from zeus.monitor import slicer


def _wait(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "zeus-slicer"]


def test_schedules_share_one_thread_that_ends_with_the_last() -> None:
    runs: dict[str, list[float]] = {"a": [], "b": []}
    a = slicer.every(0.02, lambda: runs["a"].append(time.time()))
    b = slicer.every(0.03, lambda: runs["b"].append(time.time()), now=True)
    _wait(lambda: len(runs["a"]) >= 5 and len(runs["b"]) >= 4, "both schedules to run")
    assert len(_threads()) == 1
    assert all(t.name == "zeus-slicer" for t in _threads())
    a.cancel()
    done = len(runs["a"])
    _wait(lambda: len(runs["b"]) >= 8, "the other schedule to go on")
    assert len(runs["a"]) <= done + 1  # at most the run in progress at cancel
    b.cancel()
    _wait(lambda: not _threads(), "the thread to end with its last schedule")


def test_aligned_schedules_run_at_multiples_of_their_period() -> None:
    period = 0.05
    # Start mid-period: a schedule counting from its start would run at that phase each time.
    _wait(lambda: 0.02 < time.time() % period < 0.03, "the middle of a period")
    phases: list[float] = []
    s = slicer.every(period, lambda: phases.append(time.time() % period), aligned=True)
    _wait(lambda: len(phases) >= 6, "six aligned runs")
    s.cancel()
    # Runs come just after each boundary; a loaded machine may hold some up, rarely most.
    phases.sort()
    assert phases[len(phases) // 2] < 0.015, phases


def test_a_failing_action_is_logged_and_keeps_its_schedule(caplog) -> None:
    calls = []

    def flaky() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="zeus.monitor.slicer"):
        s = slicer.every(0.01, flaky)
        _wait(lambda: len(calls) >= 3, "three runs despite the errors")
        s.cancel()
    assert "boom" in caplog.text


def test_a_period_must_be_positive() -> None:
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="period must be a positive number"):
            slicer.every(bad, lambda: None)
