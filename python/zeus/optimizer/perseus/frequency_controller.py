"""Set a GPU's locked graphics clock off the training thread.

The training thread only records the wanted frequency and signals a condition variable; a
daemon thread applies the latest request (older, not yet applied requests are dropped: only
the newest clock matters). The reference uses a separate process fed by a queue; a thread is
enough because the NVML call releases the GIL, and it starts in microseconds.

Clocks are locked through a settings guard (`zeus.device.settings`), which journals the lock
before the first change and resets the clocks on every exit path: `end()` (also called from
`atexit`), SIGINT and SIGTERM (then the signal does what it did before), and, after a SIGKILL,
the next controller's or power-limit optimizer's start, `python -m zeus.device restore` or
`zeus-monitor --restore`.
"""

from __future__ import annotations

import atexit
import threading
from pathlib import Path
from typing import Optional

from zeus.device import GPUs, get_gpus
from zeus.device.settings import SettingsGuard, restore_stale
from zeus.util.logging import get_logger

logger = get_logger(__name__)

__all__ = ["FrequencyController"]


class FrequencyController:
    """Applies locked graphics clocks to one GPU from a background thread.

    On start the memory clock is locked to its maximum (where supported) and the graphics
    clock to the maximum supported at that memory clock.

    Args:
        device_id: GPU index (as `zeus.device.get_gpus()` sees it).
        gpus: The GPUs object; default `get_gpus()`.
        journal_dir: Journal directory; default `zeus._core.settings.journal_dir()`.

    """

    def __init__(
        self, device_id: int = 0, gpus: GPUs | None = None, journal_dir: str | Path | None = None
    ) -> None:
        """Undo stale journaled changes, lock the clocks to their maxima, start the worker."""
        self.device_id = device_id
        self.gpus = gpus if gpus is not None else get_gpus()
        # Put back what a killed earlier run left behind before locking anything.
        restore_stale(self.gpus, journal_dir=journal_dir)
        mem = max(self.gpus.get_supported_memory_clocks(device_id))
        self.max_frequency = max(self.gpus.get_supported_graphics_clocks(device_id, mem))
        self._guard = SettingsGuard(self.gpus, journal_dir)
        try:
            self._guard.lock_memory_clocks(device_id, mem, mem)
        except Exception:
            pass
        self._guard.lock_gpu_clocks(device_id, self.max_frequency, self.max_frequency)
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
        atexit.register(self.end)
        self._thread.start()

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
                    self._guard.lock_gpu_clocks(self.device_id, wanted, wanted)
                    self._current = wanted
            except Exception as e:
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
            for line in self._guard.restore():
                logger.info("%s.", line)
        except Exception as e:
            # The journal entry stays, so a later restore retries the reset.
            logger.warning("Restoring GPU %d clocks failed: %s", self.device_id, e)
        try:
            atexit.unregister(self.end)
        except Exception:
            pass

    def __enter__(self) -> FrequencyController:
        """Use as a context manager; `end()` on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore the clocks."""
        self.end()
