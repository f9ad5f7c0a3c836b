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
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from zeus.util import cli

APP_FACTORY = "zeus.optimizer.batch_size.server.cli:worker_app"
# The supervising process's pid, for its workers (set before uvicorn starts them).
_PARENT_ENV = "ZEUS_BSO_SUPERVISOR_PID"


def _die_with_parent(parent: int) -> None:
    """Make this worker process exit when the supervisor `parent` dies, even by SIGKILL.

    Otherwise the workers keep serving the port and a restarted server fails with "Address
    already in use". Linux only (prctl); elsewhere a no-op.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) != 0:
        return
    if os.getppid() != parent:  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def worker_app() -> Any:
    """The app factory uvicorn calls in each process: a worker of a supervisor dies with it."""
    from zeus.optimizer.batch_size.server.app import create_app

    parent = os.environ.get(_PARENT_ENV)
    if parent is not None and parent.isdigit() and int(parent) != os.getpid():
        _die_with_parent(int(parent))
    return create_app()


PROG = "zeus-bso-server"


def _settings() -> type:
    from zeus.optimizer.batch_size.server.config import ZeusBsoSettings

    return ZeusBsoSettings


def _parser() -> argparse.ArgumentParser:
    p = cli.server_parser(
        PROG, "Zeus batch size optimizer server", _settings, "ZEUS_BSO_", "bso-server", 8000
    )
    p.add_argument("command", nargs="?", choices=["serve", "migrate"], default="serve")
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


def _check_database_url(url: str) -> None:
    """Refuse a URL that is not SQLite or PostgreSQL, naming it."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        backend = make_url(url).get_backend_name()
    except ArgumentError:
        backend = None
    if backend not in ("sqlite", "postgresql"):
        raise cli.CliError(
            f"database URL {url!r} is not a SQLite or PostgreSQL URL",
            "use sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER:PASSWORD@HOST/DB",
            2,
        )


def _check_sqlite_path(url: str) -> None:
    """Refuse a SQLite database that cannot be created, naming its path."""
    _, sep, path = url.partition(":///")
    if not sep or not path or path.startswith(":memory:"):
        return
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise cli.CliError(
            f"cannot create the SQLite database {path}: directory {parent} does not exist",
            "create it, or point --database-url (ZEUS_BSO_DATABASE_URL) elsewhere",
        )
    if not os.access(parent, os.W_OK):
        raise cli.CliError(
            f"cannot create the SQLite database {path}: directory {parent} is not writable",
            "point --database-url (ZEUS_BSO_DATABASE_URL) at a writable directory",
        )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `zeus-bso-server` console script."""
    return cli.run(PROG, _main, argv, extra="bso-server")


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.workers < 1:
        raise cli.CliError(f"--workers must be >= 1, got {args.workers}", "see --help", 2)
    if args.database_url is not None:
        # Through the environment so that every uvicorn worker process sees it.
        os.environ["ZEUS_BSO_DATABASE_URL"] = args.database_url
    from zeus.optimizer.batch_size.server.config import ZeusBsoSettings

    settings = ZeusBsoSettings()  # bad settings fail here, in one line, before binding
    _check_database_url(settings.database_url)
    if settings.is_sqlite:
        _check_sqlite_path(settings.database_url)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    if args.migrate or args.command == "migrate":
        asyncio.run(_migrate())
        logging.getLogger("zeus.optimizer.batch_size.server").info("Database migrated")
        return 0

    import uvicorn

    from zeus.optimizer.batch_size.server.keepalive import UVICORN_KEEPALIVE_TIMEOUT

    os.environ[_PARENT_ENV] = str(os.getpid())

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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
