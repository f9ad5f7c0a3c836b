# Hand-kept stubs of `zeus._core.settings`: GPU settings and their journal
# (src/python/device/settings.rs).
# Keep in sync with the #[pymethods] / #[pyfunction] signatures.

import os
import pathlib
from typing import Any, Self, TypeAlias, final

from zeus._core.device import GPUs

__all__ = [
    "SettingsGuard",
    "journal_dir",
    "journal_entries",
    "journal_unreadable",
    "journal_restore",
    "restore_all_settings",
]

_StrPath: TypeAlias = str | os.PathLike[str]

# A journal entry: {"uuid": str, "kind": "power_limit" | "clocks", "power_limit_mw": int (power
# limits) or "gpu_clocks"/"memory_clocks": bool (clocks), "holders": [{"pid": int,
# "start_time": int | None, "boot_id": str | None, "alive": bool}], "pid": int | None (first
# holder), "created": int (epoch s)}.
# journal_restore's restored dicts: {"index", "uuid", "kind", the kind's fields,
# "original_known": bool, "pids": list[int], "description": str}; its failed dicts: {"index",
# "uuid": str | None, "kind": str | None, "error": Exception, "description": str}.
_JournalEntry: TypeAlias = dict[str, Any]

@final
class SettingsGuard:
    def __new__(
        cls, gpus: GPUs, journal_dir: _StrPath | None = None, owner_pid: int | None = None
    ) -> Self: ...
    @property
    def journal_dir(self) -> pathlib.Path: ...
    @property
    def active(self) -> bool: ...
    def original_power_limit(self, gpu_index: int) -> int | None: ...
    def set_power_limit(self, gpu_index: int, power_limit_mw: int) -> None: ...
    def lock_gpu_clocks(self, gpu_index: int, min_clock_mhz: int, max_clock_mhz: int) -> None: ...
    def lock_memory_clocks(
        self, gpu_index: int, min_clock_mhz: int, max_clock_mhz: int
    ) -> None: ...
    def restore(self) -> list[str]: ...

def journal_dir() -> pathlib.Path: ...
def journal_entries(dir: _StrPath | None = None) -> list[_JournalEntry]: ...
def journal_unreadable(dir: _StrPath | None = None) -> list[dict[str, Any]]: ...
def journal_restore(
    gpus: GPUs, include_live: bool = False, dir: _StrPath | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]: ...
def restore_all_settings() -> list[BaseException]: ...
