"""Journal entries as files, for tests that need what only a dead or foreign process leaves.

The file format is documented in `crates/zeus-core/src/device/settings/journal.rs`; writing it
here (in the older pid-only form, which must keep reading) is how a test stands in for a zeus
process of another build or one that was killed long ago.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def gone_pid() -> int:
    """The pid of a process that has just ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def entry_path(state: Path, kind: str, uuid: str) -> Path:
    """Where the journal keeps GPU `uuid`'s entry of `kind` (`power_limit` or `clocks`)."""
    prefix = {"power_limit": "power-limit-", "clocks": "clocks-"}[kind]
    return state / f"{prefix}{uuid}.json"


def write_entry(
    state: Path,
    uuid: str,
    *,
    pid: int | None = None,
    holders: list[dict[str, Any]] | None = None,
    power_limit_mw: int | None = None,
    gpu_clocks: bool = False,
    memory_clocks: bool = False,
) -> Path:
    """Write a power-limit entry (with `power_limit_mw`) or a clock entry (without)."""
    body: dict[str, Any] = {"uuid": uuid, "created": 0}
    if power_limit_mw is not None:
        kind = "power_limit"
        body["power_limit_mw"] = power_limit_mw
    else:
        kind = "clocks"
        body.update(gpu_clocks=gpu_clocks, memory_clocks=memory_clocks)
    if pid is not None:
        body["pid"] = pid
    if holders is not None:
        body["holders"] = holders
    state.mkdir(parents=True, exist_ok=True)
    path = entry_path(state, kind, uuid)
    path.write_text(json.dumps(body))
    return path
