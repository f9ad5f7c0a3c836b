"""Console-script launchers for the Rust binaries shipped inside the package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_BIN_DIR = Path(__file__).resolve().parent / "_bin"


def _exec(name: str, args: list[str] | None = None) -> None:
    """Replace this process with the bundled binary `name`, given `args` (default: ours)."""
    path = _BIN_DIR / name
    if not path.is_file():
        sys.stderr.write(f"{name}: the binary is missing at {path}; reinstall zeus from source\n")
        raise SystemExit(127)
    # Replace this process, so signals (Ctrl-C, SIGTERM) reach the Rust binary directly.
    os.execv(path, [name, *(sys.argv[1:] if args is None else args)])


def zeus_monitor() -> None:
    """Run the standalone `zeus-monitor` power logger and Prometheus exporter."""
    _exec("zeus-monitor")


def zeusd() -> None:
    """Run `zeusd`, the GPU settings daemon."""
    _exec("zeusd")
