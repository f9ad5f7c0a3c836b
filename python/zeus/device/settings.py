"""GPU settings that outlive the process (power limits, locked clocks), always put back.

The mechanism lives in Rust (`crates/zeus-core/src/device/settings/`): `SettingsGuard` journals
the value to return to before its first change (one JSON file per GPU and kind, listing every
process that holds the setting changed), and when it is restored the last live holder out puts
the original back. This module adds what only Python can do well, the hooks:

- at interpreter exit (`atexit`), which also covers an uncaught exception;
- on SIGINT and SIGTERM, after which the signal does what it did before
  (`zeus.util.signals.run_before`: the default SIGINT handler raises `KeyboardInterrupt`, and
  the process still dies of SIGTERM). A native handler would be replaced by the next
  `signal.signal` of any library, and NVML must not be called from inside a signal handler.

SIGKILL cannot be caught: the journal survives it, and `restore_stale` (run when a power-limit
optimizer or frequency controller starts, by `python -m zeus.device restore`, or by
`zeus-monitor --restore`) puts back every setting no running process holds. Holders are known
by pid, start time and boot, so a reused pid does not keep a dead process's setting alive.
"""

from __future__ import annotations

import atexit
import signal
import threading
from pathlib import Path
from typing import Any

from zeus import _core
from zeus.util import signals
from zeus.util.logging import get_logger

logger = get_logger(__name__)

__all__ = ["SettingsGuard", "restore_all", "restore_stale"]

_hooks_lock = threading.Lock()
_atexit_registered = False


def restore_all() -> None:
    """Restore every settings guard of this process; errors are logged (exit/signal hooks)."""
    for error in _core.restore_all_settings():
        logger.error("Cannot restore a GPU setting: %s", error)


def _install_hooks() -> None:
    global _atexit_registered
    with _hooks_lock:
        if not _atexit_registered:
            atexit.register(restore_all)
            _atexit_registered = True
    if threading.current_thread() is not threading.main_thread():
        logger.warning(
            "Not in the main thread: cannot install SIGINT/SIGTERM handlers; GPU settings are "
            "still restored at exit and from the journal after a crash."
        )
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signals.run_before(sig, restore_all)


def SettingsGuard(  # noqa: N802  (a constructor to its users)
    gpus: _core.GPUs, journal_dir: str | Path | None = None, owner_pid: int | None = None
) -> _core.SettingsGuard:
    """A `zeus._core.SettingsGuard` on `gpus`, with the exit and signal hooks installed.

    Args:
        gpus: The `GPUs` object (`zeus.device.get_gpus()`).
        journal_dir: Journal directory; default `zeus._core.journal_dir()`.
        owner_pid: Hold the changes on behalf of this running process (default: this one).

    """
    guard = _core.SettingsGuard(gpus, journal_dir, owner_pid)
    _install_hooks()
    return guard


def restore_stale(
    gpus: _core.GPUs, include_live: bool = False, journal_dir: str | Path | None = None
) -> list[dict[str, Any]]:
    """Undo the journaled changes (power limits, locked clocks) no running process holds.

    Every kind on every visible GPU is tried (`zeus._core.journal_restore`); what was restored
    is logged as a warning (someone left the GPU changed), what cannot be restored as a warning
    too, and stays journaled for the next try.

    Args:
        gpus: The `GPUs` object.
        include_live: Also restore settings that running processes hold.
        journal_dir: Journal directory; default `zeus._core.journal_dir()`.

    Returns:
        The restored settings, as the dicts of `zeus._core.journal_restore`.

    """
    restored, failed = _core.journal_restore(gpus, include_live, journal_dir)
    for r in restored:
        logger.warning("%s, left by a process that ended without restoring it.", r["description"])
    for f in failed:
        logger.warning("%s; the entry is kept.", f["description"])
    return restored
