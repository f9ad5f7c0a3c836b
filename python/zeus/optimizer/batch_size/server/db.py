"""Engine creation and schema migration.

Concurrency model: every request is one short transaction that first locks the job's row, so
all reads and writes of one job are serialised by the database itself, also across server
processes. On PostgreSQL that lock is `SELECT ... FOR UPDATE`; SQLite has no row locks, so
every transaction starts with `BEGIN IMMEDIATE`, which takes the database's write lock up
front (readers keep going thanks to WAL mode). Registration relies on the primary key and
retries on a conflict.

Execution model: a transaction is one synchronous function over a SQLAlchemy `Connection`
(see `service.py`). On PostgreSQL (asyncpg) it runs through `AsyncConnection.run_sync`, so
every statement awaits the network without blocking the event loop. On SQLite it runs directly
on the event loop thread with the standard `sqlite3` driver: a statement on a local file takes
microseconds, far less than the two thread hops per statement aiosqlite would cost, and with
one connection per process the requests would queue for it anyway. The price is that a
process waiting for another process's SQLite write lock stalls its loop; deployments with
several server processes should use PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Advisory lock key that serialises concurrent `migrate` runs on PostgreSQL ("zeusbso").
PG_MIGRATION_LOCK_KEY = 0x7A657573_62736F


def is_sqlite_url(url: str) -> bool:
    """Whether an SQLAlchemy URL points at SQLite."""
    return url.startswith("sqlite")


def sqlite_sync_url(url: str) -> sa.URL:
    """The same SQLite database through the standard `sqlite3` driver."""
    return sa.make_url(url).set(drivername="sqlite")


class Database:
    """Runs transactions on the configured database (see the module docstring)."""

    def __init__(self, url: str, *, pool_size: int = 10, echo: bool = False) -> None:
        """Create the engine for `url` (an async SQLAlchemy URL, or any SQLite URL)."""
        self.url = url
        self.sync_engine: sa.Engine | None = None
        self._sqlite_conn: sa.Connection | None = None
        self.async_engine: AsyncEngine | None = None
        if is_sqlite_url(url):
            # One connection: SQLite serialises writers anyway, and every transaction runs to
            # completion without yielding to the event loop.
            self.sync_engine = sa.create_engine(
                sqlite_sync_url(url),
                echo=echo,
                poolclass=sa.pool.QueuePool,
                pool_size=1,
                max_overflow=0,
                connect_args={"check_same_thread": False, "timeout": 30},
            )
            _tune_sqlite(self.sync_engine)
        else:
            self.async_engine = create_async_engine(
                url,
                echo=echo,
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_timeout=120,
                pool_pre_ping=True,
            )

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(connection, *args)` in one transaction; commit on return, roll back on raise."""
        if self.sync_engine is not None:
            # One long-lived connection: nothing else can use it in between, since the
            # transaction runs to completion without yielding, and it spares a pool checkout
            # and reset per request.
            conn = self._sqlite_conn
            if conn is None or conn.closed or conn.invalidated:
                conn = self._sqlite_conn = self.sync_engine.connect()
            with conn.begin():
                return fn(conn, *args)
        assert self.async_engine is not None
        async with self.async_engine.begin() as aconn:
            return await aconn.run_sync(fn, *args)

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema to `revision` in one transaction.

        Safe to run from several processes at once: on PostgreSQL a transaction-scoped advisory
        lock serialises them, on SQLite `BEGIN IMMEDIATE` does.
        """
        await self.run(_upgrade, revision)

    async def dispose(self) -> None:
        """Close every pooled connection."""
        if self._sqlite_conn is not None:
            self._sqlite_conn.close()
            self._sqlite_conn = None
        if self.sync_engine is not None:
            self.sync_engine.dispose()
        if self.async_engine is not None:
            await self.async_engine.dispose()


def _tune_sqlite(engine: sa.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the driver so that we can BEGIN IMMEDIATE.
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        # NORMAL is durable across process crashes (SIGKILL) in WAL mode; only an OS crash can
        # lose the last transactions.
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def alembic_config(url: str | None = None) -> Any:
    """Alembic configuration pointing at the package's migrations (no alembic.ini needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _upgrade(conn: sa.Connection, revision: str) -> None:
    from alembic import command

    if conn.dialect.name == "postgresql":
        conn.execute(sa.text(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK_KEY})"))
    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, revision)
