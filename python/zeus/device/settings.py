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

With zeusd (`ZEUSD_SOCK_PATH` / `ZEUSD_HOST_PORT`, see `zeus.device.zeusd`) the daemon makes
the changes, so the *daemon* journals them and restores them (after a crash of the client
too); a client process keeps no journal. `SettingsGuard` then returns a `ZeusdSettingsGuard`:
it remembers in memory what it changed and, when restored (explicitly, at exit or on a
signal), asks the daemon to put each setting back. `restore_stale` leaves the local journal
alone: its entries, if any, belong to processes that wrote directly, and restoring them needs
the privileges a daemon client does not have (`python -m zeus.device restore`, run as root,
does it).
"""

from __future__ import annotations

import atexit
import signal
import threading
import weakref
from pathlib import Path
from typing import Any, Optional, Union

from zeus import _core
from zeus.device.exception import ZeusGPUNotSupportedError
from zeus.util import signals
from zeus.util.logging import get_logger

logger = get_logger(__name__)

__all__ = ["SettingsGuard", "ZeusdSettingsGuard", "restore_all", "restore_stale"]

_hooks_lock = threading.Lock()
_atexit_registered = False

# The live daemon guards, oldest first (the Rust guards keep their own list).
_zeusd_guards: list[weakref.ref[ZeusdSettingsGuard]] = []
_zeusd_guards_lock = threading.Lock()


def restore_all() -> None:
    """Restore every settings guard of this process; errors are logged (exit/signal hooks)."""
    with _zeusd_guards_lock:
        guards = [g for g in (ref() for ref in _zeusd_guards) if g is not None]
    # Newest first, like the Rust guards: a stack of changes being unwound.
    for guard in reversed(guards):
        try:
            guard.restore()
        except Exception as e:
            logger.error("Cannot restore a GPU setting through zeusd: %s", e)
    for error in _core.settings.restore_all_settings():
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


class ZeusdSettingsGuard:
    """The settings guard of a process whose GPU writes go through zeusd.

    The same methods as `zeus._core.settings.SettingsGuard`, without a local journal: the daemon
    journals what it changes and restores it should this process die. This object remembers,
    in memory, the power limit each GPU had before its first change and which clocks it
    locked; `restore()` gives those holds back to the daemon (`/gpu/release`), which restores
    each setting unless another client holds it too. (Writing the original back instead, as
    with a daemon without that endpoint, would make this process a holder of that value, and
    other clients would get 409 until it exited.)
    Every setting is tried; one that fails stays held (a later `restore()` retries it) and the
    first error is raised. Thread-safe.
    """

    journal_dir: Optional[Path] = None
    """Always None: the client keeps no journal."""

    def __init__(self, gpus: Any) -> None:
        if getattr(gpus, "zeusd", None) is None:
            raise ValueError("ZeusdSettingsGuard needs GPUs whose writes go through zeusd")
        self.gpus = gpus
        self._lock = threading.Lock()
        self._power: dict[int, int] = {}
        self._clocks: dict[int, set[str]] = {}
        self._no_release = False

    @property
    def active(self) -> bool:
        """Whether some setting is changed and not yet restored."""
        with self._lock:
            return bool(self._power) or any(self._clocks.values())

    def original_power_limit(self, gpu_index: int) -> int | None:
        """The power limit GPU `gpu_index` returns to, mW, if this guard changed it."""
        with self._lock:
            return self._power.get(gpu_index)

    def set_power_limit(self, gpu_index: int, power_limit_mw: int) -> None:
        """Set the power limit (mW) through zeusd, remembering the original first."""
        with self._lock:
            if gpu_index not in self._power:
                # Reads stay direct: the limit in force before this guard's first change.
                original = self.gpus.get_power_management_limit(gpu_index)
            else:
                original = self._power[gpu_index]
            self.gpus.set_power_management_limit(gpu_index, power_limit_mw)
            self._power[gpu_index] = original

    def lock_gpu_clocks(self, gpu_index: int, min_clock_mhz: int, max_clock_mhz: int) -> None:
        """Lock the graphics clocks (MHz) through zeusd; `restore()` unlocks them."""
        with self._lock:
            self.gpus.set_gpu_locked_clocks(gpu_index, min_clock_mhz, max_clock_mhz)
            self._clocks.setdefault(gpu_index, set()).add("gpu")

    def lock_memory_clocks(self, gpu_index: int, min_clock_mhz: int, max_clock_mhz: int) -> None:
        """Lock the memory clocks (MHz) through zeusd; `restore()` unlocks them."""
        with self._lock:
            self.gpus.set_memory_locked_clocks(gpu_index, min_clock_mhz, max_clock_mhz)
            self._clocks.setdefault(gpu_index, set()).add("memory")

    def restore(self) -> list[str]:
        """Ask zeusd to put back everything this guard changed; idempotent.

        Returns:
            One line per setting put back.

        """
        lines: list[str] = []
        first: Optional[BaseException] = None
        with self._lock:
            for index in sorted(self._power):
                mw = self._power[index]
                try:
                    if not self._released(index, "power_limit"):
                        self.gpus.set_power_management_limit(index, mw)
                except Exception as e:
                    first = first or e
                    continue
                del self._power[index]
                lines.append(f"GPU {index}: restored power limit {mw} mW through zeusd")
            for index in sorted(self._clocks):
                kinds = self._clocks[index]
                if kinds and self._released(index, "clocks"):
                    kinds.clear()
                    lines.append(f"GPU {index}: unlocked clocks through zeusd")
                    continue
                for kind, reset in (
                    ("gpu", self.gpus.reset_gpu_locked_clocks),
                    ("memory", self.gpus.reset_memory_locked_clocks),
                ):
                    if kind not in kinds:
                        continue
                    try:
                        reset(index)
                    except Exception as e:
                        first = first or e
                        continue
                    kinds.discard(kind)
                    lines.append(f"GPU {index}: unlocked {kind} clocks through zeusd")
            self._clocks = {i: k for i, k in self._clocks.items() if k}
        if first is not None:
            raise first
        return lines

    def _released(self, index: int, setting: str) -> bool:
        """Give the hold back to the daemon, which restores the setting.

        False when the daemon has no `/gpu/release` (upstream's): the caller then writes the
        original back, and that daemon counts this process as holding it until it exits.
        """
        if self._no_release:
            return False
        try:
            self.gpus.release_setting(index, setting)
        except ZeusGPUNotSupportedError:
            self._no_release = True
            return False
        return True


def SettingsGuard(
    gpus: _core.device.GPUs, journal_dir: str | Path | None = None, owner_pid: int | None = None
) -> Union[_core.settings.SettingsGuard, ZeusdSettingsGuard]:
    """A settings guard on `gpus`, with the exit and signal hooks installed.

    A `zeus._core.settings.SettingsGuard` (journaled, local restores), or a
    `ZeusdSettingsGuard` when the writes of `gpus` go through zeusd (`gpus.zeusd` is set): then
    `journal_dir` and
    `owner_pid` are ignored, since the daemon journals and owns the changes.

    Args:
        gpus: The `GPUs` object (`zeus.device.get_gpus()`).
        journal_dir: Journal directory; default `zeus._core.settings.journal_dir()`.
        owner_pid: Hold the changes on behalf of this running process (default: this one).

    """
    guard: Union[_core.settings.SettingsGuard, ZeusdSettingsGuard]
    if getattr(gpus, "zeusd", None) is not None:
        guard = ZeusdSettingsGuard(gpus)
        with _zeusd_guards_lock:
            _zeusd_guards[:] = [r for r in _zeusd_guards if r() is not None]
            _zeusd_guards.append(weakref.ref(guard))
    else:
        guard = _core.settings.SettingsGuard(gpus, journal_dir, owner_pid)
    _install_hooks()
    return guard


def restore_stale(
    gpus: _core.device.GPUs, include_live: bool = False, journal_dir: str | Path | None = None
) -> list[dict[str, Any]]:
    """Undo the journaled changes (power limits, locked clocks) no running process holds.

    Every kind on every visible GPU is tried (`zeus._core.settings.journal_restore`); what was
    restored is logged as a warning (someone left the GPU changed), what cannot be restored as a
    warning too, and stays journaled for the next try.

    Args:
        gpus: The `GPUs` object.
        include_live: Also restore settings that running processes hold.
        journal_dir: Journal directory; default `zeus._core.settings.journal_dir()`.

    With zeusd (`gpus.zeusd` set) nothing is done and `[]` returned: the daemon restores what
    its dead clients left, and this process may not write to the GPUs itself.

    Returns:
        The restored settings, as the dicts of `zeus._core.settings.journal_restore`.

    """
    if getattr(gpus, "zeusd", None) is not None:
        logger.debug("GPU writes go through zeusd, which restores stale settings itself.")
        return []
    restored, failed = _core.settings.journal_restore(gpus, include_live, journal_dir)
    for r in restored:
        logger.warning("%s, left by a process that ended without restoring it.", r["description"])
    for f in failed:
        logger.warning("%s; the entry is kept.", f["description"])
    return restored
