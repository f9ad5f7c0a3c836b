"""`zeus-perseus-server`: serve Perseus frequency plans on loopback unless told otherwise.

Settings come from `PERSEUS_*` environment variables (`--help` lists them). This module imports
nothing of the server until it runs, so a missing `perseus` extra is one line of error.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from zeus.util import cli

PROG = "zeus-perseus-server"
# Seconds a stopping server waits for open requests after answering the pending ones 503.
GRACE_S = 3


def _settings() -> type:
    from zeus.optimizer.perseus.server.config import PerseusSettings

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

    from zeus.optimizer.perseus.server.config import PerseusSettings
    from zeus.optimizer.perseus.server.router import create_app

    settings = PerseusSettings()  # fail fast on bad settings, before binding the port
    app = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=settings.log_level.lower(),
            timeout_graceful_shutdown=GRACE_S,
        )
    )
    exit_server = server.handle_exit

    def handle_exit(sig: int, frame: object) -> None:
        # Schedule requests wait for every rank of their job: answer them 503 first, or the
        # graceful shutdown would wait for ranks that may never come.
        loop = getattr(app.state, "loop", None)
        manager = getattr(app.state, "job_manager", None)
        if loop is not None and manager is not None:
            loop.call_soon_threadsafe(manager.fail_pending)
        exit_server(sig, frame)  # type: ignore[arg-type]

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
