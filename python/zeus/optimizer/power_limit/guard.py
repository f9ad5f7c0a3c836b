"""Put the original power limits back, whatever way the process ends.

`PowerLimitGuard` is what the optimizer changes power limits through. Before its first change it
journals each GPU's original limit on disk (`zeus._core.journal_*`, one JSON file per GPU UUID),
and it restores the originals and clears the journal:

- on `restore()` (the optimizer's `close()` or its context-manager exit, e.g. on an exception);
- at interpreter exit (`atexit`), which also covers an uncaught exception;
- on SIGINT and SIGTERM, after which the signal does what it did before
  (`zeus.util.signals.run_before`: the default SIGINT handler raises `KeyboardInterrupt`, and
  the process still dies of SIGTERM). A signal the process ignores is left alone: it does not
  end the run, so nothing is restored on it.

SIGKILL cannot be caught: the journal survives it, and the next optimizer on the machine (or
`python -m zeus.device restore`, or `zeus-monitor --restore`) puts the originals back through
`zeus.device.journal.restore_stale`, which undoes every kind of journaled change, including
clocks locked by `zeus.optimizer.perseus.FrequencyController`.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from pathlib import Path
from typing import Any, Sequence

from zeus import _core
from zeus.util import signals
from zeus.util.logging import get_logger

logger = get_logger(__name__)

_lock = threading.RLock()
_active: list[PowerLimitGuard] = []
_atexit_registered = False


def restore_all() -> None:
    """Restore every active guard of this process (idempotent)."""
    with _lock:
        guards = list(_active)
    for g in reversed(guards):
        try:
            g.restore()
        except Exception:  # noqa: BLE001  (one GPU failing must not stop the others)
            logger.exception("Failed to restore power limits of GPUs %s", g.gpu_indices)


def _install_hooks() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(restore_all)
        _atexit_registered = True
    if threading.current_thread() is not threading.main_thread():
        logger.warning(
            "Not in the main thread: cannot install SIGINT/SIGTERM handlers; power limits are "
            "still restored at exit and from the journal after a crash."
        )
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signals.run_before(sig, restore_all)


class PowerLimitGuard:
    """Sets one power limit on a group of GPUs and guarantees the originals come back.

    Args:
        gpus: The `GPUs` object (`zeus.device.get_gpus()`).
        gpu_indices: The GPUs to control.
        journal_dir: Journal directory; default `zeus._core.journal_dir()` at construction.

    """

    def __init__(
        self, gpus: Any, gpu_indices: Sequence[int], journal_dir: str | Path | None = None
    ) -> None:
        """Remember the GPUs; nothing is changed or journaled until the first `set`."""
        self.gpus = gpus
        self.gpu_indices = list(gpu_indices)
        self.journal_dir = Path(journal_dir) if journal_dir is not None else _core.journal_dir()
        self.uuids = [gpus.get_uuid(i) for i in self.gpu_indices]
        self.original_mw: list[int] | None = None
        self.current_mw: int | None = None

    @property
    def active(self) -> bool:
        """Whether limits were changed and not yet restored."""
        return self.original_mw is not None

    def _journal(self) -> None:
        originals = []
        for i, uuid in zip(self.gpu_indices, self.uuids):
            now = self.gpus.get_power_management_limit(i)
            try:
                entry = _core.journal_record(uuid, now, self.journal_dir)
            except OSError as e:
                # A read-only home must not stop training: exit and signal restores still work.
                logger.warning(
                    "Cannot journal GPU %d's original power limit in %s (%s); it will not be "
                    "restored if this process is killed with SIGKILL. Set ZEUS_STATE_DIR to a "
                    "writable directory to fix this.",
                    i,
                    self.journal_dir,
                    e,
                )
                entry = {"pid": os.getpid(), "power_limit_mw": now}
            if entry["pid"] != os.getpid() and _core.process_alive(entry["pid"]):
                logger.warning(
                    "GPU %d (%s) was already changed by running process %d; its original "
                    "power limit %d mW is kept in the journal.",
                    i,
                    uuid,
                    entry["pid"],
                    entry["power_limit_mw"],
                )
            originals.append(int(entry["power_limit_mw"]))
        self.original_mw = originals
        with _lock:
            if self not in _active:
                _active.append(self)
        _install_hooks()

    def set(self, milliwatts: int) -> None:
        """Set `milliwatts` on every GPU (skipped when it is already in force)."""
        if milliwatts == self.current_mw:
            return
        if self.original_mw is None:
            self._journal()
        logger.info("[GlobalPowerLimitOptimizer] Setting power limit to %d W.", milliwatts // 1000)
        for i in self.gpu_indices:
            self.gpus.set_power_management_limit(i, milliwatts)
        self.current_mw = milliwatts

    def restore(self) -> None:
        """Put every GPU's original limit back and clear its journal entry (idempotent)."""
        originals = self.original_mw
        if originals is None:
            return
        errors: list[Exception] = []
        for i, uuid, mw in zip(self.gpu_indices, self.uuids, originals):
            try:
                self.gpus.set_power_management_limit(i, mw)
            except Exception as e:  # noqa: BLE001  (try every GPU; the entry stays journaled)
                errors.append(e)
                continue
            try:
                _core.journal_clear(uuid, self.journal_dir)
            except OSError as e:
                logger.warning("Cannot clear the journal entry of GPU %d: %s", i, e)
        self.original_mw = None
        self.current_mw = None
        with _lock:
            if self in _active:
                _active.remove(self)
        if errors:
            raise errors[0]
        logger.info(
            "Restored the original power limits %s mW of GPUs %s.", originals, self.gpu_indices
        )
