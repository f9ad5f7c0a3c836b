"""Set a GPU's locked graphics clock off the training thread.

The training thread only records the wanted frequency and signals a condition variable; a
daemon thread applies the latest request (older, not yet applied requests are dropped: only
the newest clock matters). The reference uses a separate process fed by a queue; a thread is
enough because the NVML call releases the GIL, and it starts in microseconds.

The default clocks are restored on every exit path: `end()` (also called from `atexit`, which
covers normal exit, uncaught exceptions and Ctrl-C's `KeyboardInterrupt`), and on SIGTERM
before the signal's previous disposition (`zeus.util.signals.run_before`; an ignored SIGTERM
ends nothing, so the clocks stay).

SIGKILL cannot be caught, so before its first clock change the controller journals on disk that
it locks this GPU's clocks (`zeus._core.journal_record_clocks`; the journal of
`zeus.optimizer.power_limit.guard`, one file per GPU and kind) and clears the entry after its
reset. A controller's start undoes what killed processes left in the journal (power limits and
clock locks, like `GlobalPowerLimitOptimizer`'s construction); so do
`python -m zeus.device restore` and `zeus-monitor --restore`.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from pathlib import Path
from typing import Any, Optional

from zeus import _core
from zeus.device import get_gpus
from zeus.device.journal import restore_stale
from zeus.util import signals
from zeus.util.logging import get_logger

logger = get_logger(__name__)

__all__ = ["FrequencyController"]

# Controllers alive in this process, for the SIGTERM cleanup.
_live: set[FrequencyController] = set()
_live_lock = threading.Lock()


def _end_live_controllers() -> None:
    with _live_lock:
        controllers = list(_live)
    for c in controllers:
        c.end()


class FrequencyController:
    """Applies locked graphics clocks to one GPU from a background thread.

    On start the memory clock is locked to its maximum (where supported) and the graphics
    clock to the maximum supported at that memory clock.

    Args:
        device_id: GPU index (as `zeus.device.get_gpus()` sees it).
        gpus: The GPUs object; default `get_gpus()`.
        journal_dir: Journal directory; default `zeus._core.journal_dir()`.

    """

    def __init__(
        self, device_id: int = 0, gpus: Any = None, journal_dir: str | Path | None = None
    ) -> None:
        """Undo stale journaled changes, lock the clocks to their maxima, start the worker."""
        self.device_id = device_id
        self.gpus = gpus if gpus is not None else get_gpus()
        self.journal_dir = Path(journal_dir) if journal_dir is not None else _core.journal_dir()
        self._uuid: str = self.gpus.get_uuid(device_id)
        self._journaled = False
        # Put back what a killed earlier run left behind before locking anything. The restore
        # runs in Rust on the process's GPUs object; a wrapper passed as `gpus` (e.g. a spy)
        # wraps that same process-wide object.
        core_gpus = self.gpus if isinstance(self.gpus, _core.GPUs) else get_gpus()
        restore_stale(core_gpus, journal_dir=self.journal_dir)
        mem = max(self.gpus.get_supported_memory_clocks(device_id))
        self.max_frequency = max(self.gpus.get_supported_graphics_clocks(device_id, mem))
        # Journal before the first change. Memory clocks are named even where locking them turns
        # out to be unsupported: resetting them there is a no-op the restore tolerates.
        self._journal()
        try:
            self.gpus.set_memory_locked_clocks(device_id, mem, mem)
            self._memory_locked = True
        except Exception:  # noqa: BLE001  (not supported on every GPU; optional)
            self._memory_locked = False
        self.gpus.set_gpu_locked_clocks(device_id, self.max_frequency, self.max_frequency)
        self._current = self.max_frequency
        self._wanted: Optional[int] = None
        self._requests = 0
        self._applied_requests = 0
        self._error: Optional[BaseException] = None
        self._stop = False
        self._ended = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(
            target=self._worker, name=f"zeus-frequency-controller-{device_id}", daemon=True
        )
        with _live_lock:
            _live.add(self)
        signals.run_before(signal.SIGTERM, _end_live_controllers)
        atexit.register(self.end)
        self._thread.start()

    def _journal(self) -> None:
        try:
            entry = _core.journal_record_clocks(self._uuid, True, True, self.journal_dir)
        except OSError as e:
            # A read-only home must not stop training: exit and signal resets still work.
            logger.warning(
                "Cannot journal GPU %d's clock locks in %s (%s); they will not be reset if "
                "this process is killed with SIGKILL. Set ZEUS_STATE_DIR to a writable "
                "directory to fix this.",
                self.device_id,
                self.journal_dir,
                e,
            )
            return
        self._journaled = True
        if entry["pid"] != os.getpid() and _core.process_alive(entry["pid"]):
            logger.warning(
                "GPU %d (%s) clocks are also locked by running process %d.",
                self.device_id,
                self._uuid,
                entry["pid"],
            )

    @property
    def frequency(self) -> int:
        """The locked graphics clock applied last (MHz)."""
        return self._current

    def set_frequency(self, frequency: int) -> None:
        """Ask for graphics clock `frequency` (MHz); returns at once. `0` is ignored."""
        if frequency == 0:
            return
        with self._cond:
            if self._ended:
                raise RuntimeError("FrequencyController has ended")
            self._wanted = int(frequency)
            self._requests += 1
            self._cond.notify()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until every request so far is applied (or superseded and dropped).

        Returns:
            False on timeout.

        Raises:
            The exception the last clock change raised, if any.

        """
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._applied_requests >= self._requests or self._stop, timeout
            )
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            return ok

    def _worker(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._wanted is not None or self._stop)
                if self._stop:
                    return
                wanted, self._wanted = self._wanted, None
                seen = self._requests
            # wait_for only returns without `_stop` once `_wanted` is set, and only this thread
            # clears it; mypy cannot see through the predicate lambda.
            assert wanted is not None
            error: Optional[BaseException] = None
            try:
                if wanted != self._current:
                    self.gpus.set_gpu_locked_clocks(self.device_id, wanted, wanted)
                    self._current = wanted
            except Exception as e:  # noqa: BLE001  (surfaced through wait())
                logger.warning("Setting GPU %d to %d MHz failed: %s", self.device_id, wanted, e)
                error = e
            with self._cond:
                # Stored under the lock: wait() reads and clears `_error` under it, and an
                # unlocked write between its read and its clear would lose the error.
                if error is not None:
                    self._error = error
                self._applied_requests = max(self._applied_requests, seen)
                self._cond.notify_all()

    def end(self) -> None:
        """Stop the worker and restore the default clocks. Idempotent."""
        with self._cond:
            if self._ended:
                return
            self._ended = True
            self._stop = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        try:
            self.gpus.reset_gpu_locked_clocks(self.device_id)
            if self._memory_locked:
                self.gpus.reset_memory_locked_clocks(self.device_id)
        except Exception as e:  # noqa: BLE001  (exit path: report, don't mask the real error)
            # The journal entry stays, so a later restore retries the reset.
            logger.warning("Restoring GPU %d clocks failed: %s", self.device_id, e)
        else:
            if self._journaled:
                try:
                    _core.journal_clear_clocks(self._uuid, self.journal_dir)
                except OSError as e:
                    logger.warning(
                        "Cannot clear the clock journal entry of GPU %d: %s", self.device_id, e
                    )
        with _live_lock:
            _live.discard(self)
        try:
            atexit.unregister(self.end)
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> FrequencyController:
        """Use as a context manager; `end()` on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore the clocks."""
        self.end()
