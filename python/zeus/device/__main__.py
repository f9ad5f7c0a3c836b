"""`python -m zeus.device`: inspect and restore GPU settings that zeus changed.

Commands:
    journal     List the journaled GPU changes: original power limits, and GPU/memory clocks
                locked by zeus (one entry per GPU and kind changed by a process that has not
                restored it yet).
    restore     Undo them on the visible GPUs (set the original power limits back, reset
                locked clocks) and clear their entries. By default only entries of processes
                that are no longer running (e.g. killed with SIGKILL) are restored; `--all`
                restores live ones too. Exit status 1 if some entry could not be restored.

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
from zeus.device.journal import describe_restored, locked_clocks
from zeus.util import cli


def _parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="python -m zeus.device",
        description="Inspect and restore GPU settings (power limits, locked clocks) journaled "
        "by zeus.",
    )
    p.add_argument("--state-dir", type=Path, default=None, help="journal directory")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("journal", help="list journaled power limits and clock locks")
    r = sub.add_parser(
        "restore", help="restore journaled power limits, unlock journaled clocks, clear them"
    )
    r.add_argument(
        "--all",
        action="store_true",
        help="also restore entries of processes that are still running",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (expected errors: one line and a hint)."""
    return cli.run("python -m zeus.device", _main, argv)


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    state_dir = args.state_dir if args.state_dir is not None else _core.journal_dir()
    if args.command == "journal":
        entries = _core.journal_entries(state_dir)
        if not entries:
            print(f"No journaled GPU settings in {state_dir}.")
        for e in entries:
            alive = "running" if _core.process_alive(e["pid"]) else "gone"
            if e.get("kind", "power_limit") == "power_limit":
                what = f"original power limit {e['power_limit_mw']} mW"
            else:
                what = f"{locked_clocks(e)} clocks locked (original: unlocked)"
            print(f"{e['uuid']}: {what} (process {e['pid']}, {alive})")
        return 0

    from zeus.device import get_gpus

    done, failed = _core.journal_restore(get_gpus(), args.all, state_dir)
    for r in done:
        print(describe_restored(r))
    for f in failed:
        kind = (f["kind"] or "settings").replace("_", " ")
        print(
            f"GPU {f['index']} ({f['uuid']}): cannot restore {kind}: {f['error']}", file=sys.stderr
        )
    left = _core.journal_entries(state_dir)
    if not done and not failed:
        print(f"Nothing to restore in {state_dir}.")
    if left:
        print(
            f"{len(left)} entr{'y' if len(left) == 1 else 'ies'} left (process still running, "
            "GPU not visible here, or restore failed); see `python -m zeus.device journal`.",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
