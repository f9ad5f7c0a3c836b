"""`python -m zeus.device`: inspect and restore GPU settings that zeus changed.

Commands:
    journal     List the journaled original power limits (one entry per GPU changed by a
                process that has not restored it yet).
    restore     Put the journaled original power limits back on the visible GPUs and clear
                their entries. By default only entries of processes that are no longer running
                (e.g. killed with SIGKILL) are restored; `--all` restores live ones too.

The journal lives in `$ZEUS_STATE_DIR`, else `$XDG_STATE_HOME/zeus`, else `~/.local/state/zeus`,
else `/var/tmp/zeus`; `--state-dir` overrides it.

Examples:
    python -m zeus.device journal
    python -m zeus.device restore

"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from zeus import _core


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m zeus.device",
        description="Inspect and restore GPU power limits journaled by zeus.",
    )
    p.add_argument("--state-dir", type=Path, default=None, help="journal directory")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("journal", help="list journaled original power limits")
    r = sub.add_parser("restore", help="restore journaled power limits and clear them")
    r.add_argument(
        "--all",
        action="store_true",
        help="also restore entries of processes that are still running",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = _parser().parse_args(argv)
    state_dir = args.state_dir if args.state_dir is not None else _core.journal_dir()
    if args.command == "journal":
        entries = _core.journal_entries(state_dir)
        if not entries:
            print(f"No journaled GPU settings in {state_dir}.")
        for e in entries:
            alive = "running" if _core.process_alive(e["pid"]) else "gone"
            print(
                f"{e['uuid']}: original power limit {e['power_limit_mw']} mW "
                f"(process {e['pid']}, {alive})"
            )
        return 0

    from zeus.device import get_gpus
    from zeus.optimizer.power_limit.guard import restore_stale

    done = restore_stale(get_gpus(), include_live=args.all, journal_dir=state_dir)
    for index, uuid, mw, pid in done:
        print(f"GPU {index} ({uuid}): restored power limit {mw} mW (journaled by process {pid})")
    left = _core.journal_entries(state_dir)
    if not done:
        print(f"Nothing to restore in {state_dir}.")
    if left:
        print(
            f"{len(left)} entr{'y' if len(left) == 1 else 'ies'} left (process still running, "
            "or GPU not visible here); see `python -m zeus.device journal`.",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
