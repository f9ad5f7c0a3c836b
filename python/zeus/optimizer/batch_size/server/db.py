"""Engine creation and schema migration.

Concurrency model: every request is one short transaction that first locks the job's row, so
all reads and writes of one job are serialised by the database itself, also across server
processes. On PostgreSQL that lock is `SELECT ... FOR UPDATE`; SQLite has no row locks, so
every transaction starts with `BEGIN IMMEDIATE`, which takes the database's write lock up
front (readers keep going thanks to WAL mode). Registration relies on the primary key and
retries on a conflict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Advisory lock key that serialises concurrent `migrate` runs on PostgreSQL ("zeusbso").
PG_MIGRATION_LOCK_KEY = 0x7A657573_62736F


def is_sqlite_url(url: str) -> bool:
    """Whether an SQLAlchemy URL points at SQLite."""
    return url.startswith("sqlite")


def create_engine(url: str, *, pool_size: int = 10, echo: bool = False) -> AsyncEngine:
    """Create the async engine for `url`, tuned for short transactions.

    SQLite gets WAL mode, a 30 s busy timeout, foreign keys, `BEGIN IMMEDIATE` transactions
    and a single pooled connection per process (its writers serialise anyway, and waiting in
    the pool's FIFO is much fairer than SQLite's sleeping busy handler).
    """
    if is_sqlite_url(url):
        engine = create_async_engine(url, echo=echo, pool_size=1, max_overflow=0, pool_timeout=120)
        _tune_sqlite(engine)
        return engine
    return create_async_engine(
        url,
        echo=echo,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=120,
        pool_pre_ping=True,
    )


def _tune_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
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

    @event.listens_for(engine.sync_engine, "begin")
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


def _upgrade(sync_conn: sa.Connection, revision: str) -> None:
    from alembic import command

    cfg = alembic_config()
    cfg.attributes["connection"] = sync_conn
    command.upgrade(cfg, revision)


async def migrate(engine: AsyncEngine, revision: str = "head") -> None:
    """Upgrade the database schema to `revision` in one transaction.

    Safe to run from several processes at once: on PostgreSQL a transaction-scoped advisory
    lock serialises them, on SQLite `BEGIN IMMEDIATE` does.
    """
    async with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(sa.text(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK_KEY})"))
        await conn.run_sync(_upgrade, revision)
