"""`zeus-perseus-server`: serve Perseus frequency plans on loopback unless told otherwise.

Settings come from `PERSEUS_*` environment variables (`--help` lists them). This module imports
nothing of the server until it runs, so a missing `perseus` extra is one line of error.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from zeus.util import cli

PROG = "zeus-perseus-server"


def _settings() -> type:
    from zeus.optimizer.perseus.common import PerseusSettings

    return PerseusSettings


def _parser() -> argparse.ArgumentParser:
    return cli.server_parser(
        PROG, "Perseus frequency-plan server.", _settings, "PERSEUS_", "perseus", 7787
    )


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
