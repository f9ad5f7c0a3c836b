"""`python -m zeus.device`: inspect and restore GPU settings that zeus changed.

Commands:
    journal     List the journaled GPU changes: original power limits, and GPU/memory clocks
                locked by zeus (one entry per GPU and kind, with the processes holding it).
    restore     Undo them on the visible GPUs (set the original power limits back, reset
                locked clocks) and clear their entries. By default only settings no running
                process holds (e.g. left by a process killed with SIGKILL) are restored; `--all`
                restores held ones too. An unreadable entry is moved aside and its GPU gets the
                driver's default. Exit status 1 if some setting could not be restored.

The journal lives in `$ZEUS_STATE_DIR`, else `$XDG_STATE_HOME/zeus`, else `~/.local/state/zeus`,
else `/var/lib/zeus` for root and `/var/tmp/zeus-<uid>` for other users; `--state-dir` overrides
it. It is used only where no other user can change it (see `docs/zeusd.md`).

Examples:
    python -m zeus.device journal
    python -m zeus.device restore

"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from zeus import _core
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


def _holders(entry: dict[str, Any]) -> str:
    holders = entry["holders"]
    if not holders:
        return "no running holder"
    return ", ".join(f"process {h['pid']}, {'running' if h['alive'] else 'gone'}" for h in holders)


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    state_dir = args.state_dir if args.state_dir is not None else _core.settings.journal_dir()
    try:
        return _run(args.command, args.all if args.command == "restore" else False, state_dir)
    except OSError as e:
        # The journal directory itself is unreadable (permissions, not a directory).
        raise cli.CliError(
            f"cannot use the journal in {state_dir}: {e}",
            "set --state-dir or ZEUS_STATE_DIR to a directory you can read and write",
        ) from None


def _run(command: str, include_live: bool, state_dir: Path) -> int:
    if command == "journal":
        entries = _core.settings.journal_entries(state_dir)
        unreadable = _core.settings.journal_unreadable(state_dir)
        if not entries and not unreadable:
            print(f"No journaled GPU settings in {state_dir}.")
        for e in entries:
            if e["kind"] == "power_limit":
                what = f"original power limit {e['power_limit_mw']} mW"
            else:
                kinds = " and ".join(
                    n for k, n in (("gpu_clocks", "GPU"), ("memory_clocks", "memory")) if e[k]
                )
                what = f"{kinds} clocks locked (original: unlocked)"
            print(f"{e['uuid']}: {what} ({_holders(e)})")
        for u in unreadable:
            print(
                f"{u['uuid']}: unreadable {u['kind'].replace('_', ' ')} entry {u['path']} "
                f"({u['reason']}); `restore` moves it aside and applies the driver's default"
            )
        return 0

    from zeus.device import get_gpus

    done, failed = _core.settings.journal_restore(get_gpus(), include_live, state_dir)
    for r in done:
        print(r["description"])
    for f in failed:
        print(f["description"], file=sys.stderr)
    if not done and not failed:
        print(f"Nothing to restore in {state_dir}.")
    left = _core.settings.journal_entries(state_dir)
    if left:
        print(
            f"{len(left)} entr{'y' if len(left) == 1 else 'ies'} left (held by a running "
            "process, GPU not visible here, or restore failed); see `python -m zeus.device "
            "journal`.",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
