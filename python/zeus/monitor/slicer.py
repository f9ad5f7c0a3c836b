"""The one thread that cuts measurement windows in time for every monitor that slices them.

`PeriodWindows` (per-hour energy for carbon and price) and the periodic `zeus.metric` objects
(counters and gauges pushed every few seconds) all need something done at moments in time
while windows are open: a window cut (`ZeusMonitor.cut_window`) or a reading. They schedule
it here instead of each running a thread per window: one daemon thread sleeps until the
earliest due action, runs it, and schedules its next run. It starts with the first schedule
and ends when nothing is scheduled.

Actions run on that thread one after another, so they must be quick (a cut is microseconds);
slow work such as an HTTP push belongs on a thread of its caller's. An action that raises is
logged and keeps its schedule.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable, Optional

__all__ = ["Schedule", "every"]

logger = logging.getLogger(__name__)


class Schedule:
    """A periodic action on the slicer thread; `cancel()` stops it."""

    def __init__(self, period: float, action: Callable[[], None], aligned: bool) -> None:
        self.period = period
        self.action = action
        self.aligned = aligned
        self.cancelled = False

    def next_due(self, now: float) -> float:
        """The next moment the action is due after `now` (wall-clock seconds)."""
        if self.aligned:
            return (now // self.period + 1) * self.period
        return now + self.period

    def cancel(self) -> None:
        """Stop running the action (it may be running right now; it will not run again)."""
        with _cond:
            self.cancelled = True
            _cond.notify_all()


# (due, order, schedule) of every live schedule; the order breaks ties first come, first run.
_queue: list[tuple[float, int, Schedule]] = []
_order = itertools.count()
_cond = threading.Condition()
_thread: Optional[threading.Thread] = None


def every(
    period: float, action: Callable[[], None], *, aligned: bool = False, now: bool = False
) -> Schedule:
    """Run `action` every `period` seconds on the slicer thread until the schedule is cancelled.

    Args:
        period: Seconds between runs (> 0).
        action: What to run; quick, as every schedule shares the thread.
        aligned: Run at the multiples of `period` since the UNIX epoch (period boundaries,
            e.g. whole hours) instead of every `period` from now.
        now: Also run once right away (on the slicer thread).

    Raises:
        ValueError: `period` is not a positive number.

    """
    if not period > 0:
        raise ValueError(f"period must be a positive number of seconds, got {period}")
    schedule = Schedule(float(period), action, aligned)
    t = time.time()
    due = t if now else schedule.next_due(t)
    global _thread
    with _cond:
        heapq.heappush(_queue, (due, next(_order), schedule))
        if _thread is None:
            _thread = threading.Thread(target=_run, name="zeus-slicer", daemon=True)
            _thread.start()
        _cond.notify_all()
    return schedule


def _run() -> None:
    global _thread
    while True:
        with _cond:
            while True:
                while _queue and _queue[0][2].cancelled:
                    heapq.heappop(_queue)
                if not _queue:
                    _thread = None
                    return
                due, _, schedule = _queue[0]
                wait = due - time.time()
                if wait <= 0:
                    heapq.heappop(_queue)
                    break
                _cond.wait(timeout=wait)
        try:
            schedule.action()
        except Exception:
            logger.exception("a scheduled cut or reading failed")
        with _cond:
            if not schedule.cancelled:
                # After a late run (a starved thread, a slow action) the missed moments are
                # skipped rather than run back to back.
                nxt = schedule.next_due(due)
                if nxt <= time.time():
                    nxt = schedule.next_due(time.time())
                heapq.heappush(_queue, (nxt, next(_order), schedule))
