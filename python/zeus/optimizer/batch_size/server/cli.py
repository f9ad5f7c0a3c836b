"""`zeus-bso-server`: run the batch size optimizer server, or migrate its database.

    zeus-bso-server [serve] [--host 127.0.0.1] [--port 8000] [--database-url URL] [--workers N]
    zeus-bso-server migrate [--database-url URL]      # or: zeus-bso-server --migrate

Settings not given on the command line come from `ZEUS_BSO_*` environment variables (see
`config.ZeusBsoSettings`). SQLite databases are migrated automatically at start-up; run
`migrate` once before starting servers on PostgreSQL (it is safe to run it concurrently).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Optional, Sequence

APP_FACTORY = "zeus.optimizer.batch_size.server.app:create_app"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zeus-bso-server", description="Zeus batch size optimizer server"
    )
    p.add_argument("command", nargs="?", choices=["serve", "migrate"], default="serve")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    p.add_argument(
        "--database-url", default=None, help="async SQLAlchemy URL (ZEUS_BSO_DATABASE_URL)"
    )
    p.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    p.add_argument("--migrate", action="store_true", help="migrate the database and exit")
    p.add_argument("--access-log", action="store_true", help="log every request")
    return p


async def _migrate() -> None:
    from zeus.optimizer.batch_size.server.config import ZeusBsoSettings
    from zeus.optimizer.batch_size.server.db import Database

    db = Database(ZeusBsoSettings().database_url)
    try:
        await db.migrate()
    finally:
        await db.dispose()


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of the `zeus-bso-server` console script."""
    args = _parser().parse_args(argv)
    if args.workers < 1:
        raise SystemExit(f"--workers must be >= 1, got {args.workers}")
    if args.database_url is not None:
        # Through the environment so that every uvicorn worker process sees it.
        os.environ["ZEUS_BSO_DATABASE_URL"] = args.database_url
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    if args.migrate or args.command == "migrate":
        asyncio.run(_migrate())
        logging.getLogger("zeus.optimizer.batch_size.server").info("Database migrated")
        return

    import uvicorn

    from zeus.optimizer.batch_size.server.keepalive import UVICORN_KEEPALIVE_TIMEOUT

    uvicorn.run(
        APP_FACTORY,
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        access_log=args.access_log,
        log_level="info",
        # The keep-alive policy (keepalive.py) assumes uvicorn's idle timeout; pin it.
        timeout_keep_alive=int(UVICORN_KEEPALIVE_TIMEOUT),
        server_header=False,
    )


if __name__ == "__main__":
    main()
