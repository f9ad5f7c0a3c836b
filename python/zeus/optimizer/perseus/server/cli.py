"""`zeus-perseus-server`: serve Perseus frequency plans on loopback unless told otherwise.

Settings come from `PERSEUS_*` environment variables (`--help` lists them). This module imports
nothing of the server until it runs, so a missing `perseus` extra is one line of error.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from zeus.util import cli

PROG = "zeus-perseus-server"


def _settings_help() -> str:
    try:
        from zeus.optimizer.perseus.common import PerseusSettings
    except ModuleNotFoundError:
        return "settings: install the 'perseus' extra to list them"
    return cli.settings_help(PerseusSettings, "PERSEUS_")


def _parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog=PROG,
        description="Perseus frequency-plan server.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--host", type=cli.host, default="127.0.0.1", help="address to bind (default loopback)"
    )
    p.add_argument("--port", type=cli.port, default=7787, help="port (default 7787)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `zeus-perseus-server` console script."""
    return cli.run(PROG, _main, argv, extra="perseus")


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    import uvicorn

    from zeus.optimizer.perseus.common import PerseusSettings
    from zeus.optimizer.perseus.server.router import create_app

    settings = PerseusSettings()  # fail fast on bad settings, before binding the port
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=settings.log_level.lower(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
