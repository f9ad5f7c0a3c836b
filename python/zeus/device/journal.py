"""The journal of changed GPU settings: undoing what processes that are gone left behind.

Whoever changes a GPU setting that outlives the process (a power limit, locked clocks) first
journals the original on disk (`zeus._core.journal_*`, one JSON file per GPU UUID and kind;
see `crates/zeus-core/src/device/journal.rs`). A process killed with SIGKILL cannot restore
anything; the next one to open the GPU (the power-limit optimizer, Perseus's
`FrequencyController`, `python -m zeus.device restore`, `zeus-monitor --restore`) calls
`restore_stale`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zeus import _core
from zeus.util.logging import get_logger

logger = get_logger(__name__)


def locked_clocks(entry: dict[str, Any]) -> str:
    """Which clocks a clock entry of the journal says were locked: "GPU", "GPU and memory"."""
    kinds = [
        name for key, name in (("gpu_clocks", "GPU"), ("memory_clocks", "memory")) if entry.get(key)
    ]
    return " and ".join(kinds)


def describe_restored(restored: dict[str, Any]) -> str:
    """One line for a dict of `zeus._core.journal_restore`'s `restored` list."""
    if restored["kind"] == "power_limit":
        what = f"restored power limit {restored['power_limit_mw']} mW"
    else:
        what = f"unlocked {locked_clocks(restored)} clocks"
    return (
        f"GPU {restored['index']} ({restored['uuid']}): {what} "
        f"(journaled by process {restored['pid']})"
    )


def restore_stale(
    gpus: Any, include_live: bool = False, journal_dir: str | Path | None = None
) -> list[dict[str, Any]]:
    """Undo the journaled changes (power limits, locked clocks) left by processes that are gone.

    Every kind on every visible GPU is tried (`zeus._core.journal_restore`); what cannot be
    restored is logged as a warning and stays journaled for the next try.

    Args:
        gpus: The `GPUs` object.
        include_live: Also restore entries of processes that still run.
        journal_dir: Journal directory; default `zeus._core.journal_dir()`.

    Returns:
        The restored entries: dicts with `index`, `uuid`, `kind` (`power_limit` or `clocks`),
        `pid`, and `power_limit_mw` or `gpu_clocks` / `memory_clocks`. Failures (including an
        unreadable or corrupt journal file, as `OSError`) are logged, not raised.

    """
    restored, failed = _core.journal_restore(gpus, include_live, journal_dir)
    for r in restored:
        logger.warning("%s, which ended without restoring it.", describe_restored(r))
    for f in failed:
        logger.warning(
            "Cannot restore the journaled %s of GPU %d (%s): %s; the entry is kept.",
            (f["kind"] or "settings").replace("_", " "),
            f["index"],
            f["uuid"],
            f["error"],
        )
    return restored
