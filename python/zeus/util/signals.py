"""Cleaning up on the signals that end a process, then letting them end it.

GPU settings that outlive the process (power limits, locked clocks) must be put back when
SIGINT or SIGTERM ends a run. `run_before(sig, cleanup)` makes `cleanup` run first and then
hands the signal to whatever disposition it had before: a Python handler is called (the default
SIGINT handler raises `KeyboardInterrupt`), a default disposition is re-installed and the
signal re-sent, so the process still dies of it and its exit status says so.

A signal the process ignores (`nohup cmd &` starts jobs with SIGINT ignored) does not end it,
so nothing is installed for it: cleaning up would leave the run going on undone settings.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any, Callable

from zeus.util.logging import get_logger

logger = get_logger(__name__)

# Per signal: the cleanups to run, and the disposition found when our handler went in.
_cleanups: dict[int, list[Callable[[], None]]] = {}
_previous: dict[int, Any] = {}
_lock = threading.Lock()


def run_before(sig: int, cleanup: Callable[[], None]) -> bool:
    """Run `cleanup` when `sig` arrives, before the signal's previous disposition.

    Registering the same cleanup again does nothing. If another handler replaced ours since,
    ours goes back in front of it.

    Returns:
        False when nothing was installed: off the main thread (Python allows signal handlers
        only there) or when the process ignores `sig`.

    """
    if threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        current = signal.getsignal(sig)
        if current is not _on_signal:
            if current == signal.SIG_IGN:
                return False
            _previous[sig] = current
            signal.signal(sig, _on_signal)
        cleanups = _cleanups.setdefault(sig, [])
        if cleanup not in cleanups:
            cleanups.append(cleanup)
    return True


def _on_signal(signum: int, frame: FrameType | None) -> None:
    for cleanup in list(_cleanups.get(signum, ())):
        try:
            cleanup()
        except Exception:
            logger.exception("Cleanup %r on signal %d failed", cleanup, signum)
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    else:
        # The default action (terminate): let the signal do it, so the exit status says so.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
