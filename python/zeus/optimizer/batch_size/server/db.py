"""Engine creation, transactions and schema migration.

Concurrency model: every request is one short transaction that first locks the job's row, so
all reads and writes of one job are serialised by the database itself, also across server
processes. On PostgreSQL that lock is `SELECT ... FOR UPDATE`; SQLite has no row locks, so
every transaction starts with `BEGIN IMMEDIATE`, which takes the database's write lock up
front (readers keep going thanks to WAL mode). Registration relies on the primary key and
retries on a conflict.

Execution model: a transaction is one synchronous function over a `Tx`, which hands out DBAPI
cursors; the service runs SQLAlchemy Core statements compiled once per dialect (`Statement`)
on them. SQLAlchemy's per-execution machinery (cache key, execution context, result wrapping,
transaction events) cost more CPU than the statements themselves on SQLite.

- On PostgreSQL (asyncpg) the function runs through `AsyncConnection.run_sync`, so every
  statement awaits the network without blocking the event loop.
- On SQLite it runs directly on the event loop thread, on one long-lived `sqlite3` connection
  with `BEGIN IMMEDIATE` ... `COMMIT` issued by hand: a statement on a local file takes
  microseconds, far less than the two thread hops per statement aiosqlite would cost, and with
  one connection per process the requests would queue for it anyway. The price is that a
  process waiting for another process's SQLite write lock stalls its loop; deployments with
  several server processes should use PostgreSQL.

Migrations (Alembic) go through ordinary SQLAlchemy connections of the same engine.
"""

from __future__ import annotations

import logging
from collections import namedtuple
from pathlib import Path
from typing import Any, Callable, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Advisory lock key that serialises concurrent `migrate` runs on PostgreSQL ("zeusbso").
PG_MIGRATION_LOCK_KEY = 0x7A657573_62736F

sql_logger = logging.getLogger("zeus.optimizer.batch_size.server.sql")


def is_sqlite_url(url: str) -> bool:
    """Whether an SQLAlchemy URL points at SQLite."""
    return url.startswith("sqlite")


def sqlite_sync_url(url: str) -> sa.URL:
    """The same SQLite database through the standard `sqlite3` driver."""
    return sa.make_url(url).set(drivername="sqlite")


class Tx:
    """A transaction in progress: DBAPI cursors, and the dialect to compile statements for."""

    __slots__ = ("dbapi_connection", "dialect", "echo")

    def __init__(self, dbapi_connection: Any, dialect: sa.Dialect, echo: bool = False) -> None:
        """Wrap a DBAPI connection that is inside a transaction."""
        self.dbapi_connection = dbapi_connection
        self.dialect = dialect
        self.echo = echo

    def cursor(self) -> Any:
        """A new DBAPI cursor of the transaction."""
        return self.dbapi_connection.cursor()


class Statement:
    """A Core statement compiled once per dialect and executed on a DBAPI cursor.

    Bind parameters are either named (`sa.bindparam("name")`, given to `run`) or values bound
    in the statement. Only plain column types are bound (str, int, float, bool, None), which
    every driver here takes as they are, so SQLAlchemy's type processing is not needed.
    """

    __slots__ = ("stmt", "_by_dialect")

    def __init__(self, stmt: Any) -> None:
        """Wrap `stmt` (compiled on first use for each dialect)."""
        self.stmt = stmt
        self._by_dialect: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {}

    def compiled(self, dialect: sa.Dialect) -> tuple[str, tuple[str, ...], dict[str, Any]]:
        """SQL text, bind names in positional order, and the values bound in the statement."""
        found = self._by_dialect.get(dialect.name)
        if found is None:
            compiled = self.stmt.compile(dialect=dialect)
            if not compiled.positional:
                raise RuntimeError(f"dialect {dialect.name} has a non-positional paramstyle")
            literals = {k: b.value for k, b in compiled.binds.items() if not b.required}
            found = (compiled.string, tuple(compiled.positiontup or ()), literals)
            self._by_dialect[dialect.name] = found
        return found

    def run(self, tx: Tx, params: dict[str, Any]) -> Any:
        """Execute; returns the DBAPI cursor."""
        sql, order, literals = self.compiled(tx.dialect)
        values = {**literals, **params} if literals else params
        args = tuple(values[k] for k in order)
        if tx.echo:
            sql_logger.info("%s %r", sql, args)
        cur = tx.cursor()
        cur.execute(sql, args)
        return cur

    def rows(self, tx: Tx, params: dict[str, Any]) -> list[Any]:
        """Execute a SELECT; rows allow attribute access by column name."""
        cur = self.run(tx, params)
        row_type = _row_type(tuple(d[0] for d in cur.description))
        out = [row_type(*r) for r in cur.fetchall()]
        cur.close()
        return out

    def first(self, tx: Tx, params: dict[str, Any]) -> Any:
        """The first row of a SELECT, or None."""
        rows = self.rows(tx, params)
        return rows[0] if rows else None


_ROW_TYPES: dict[tuple[str, ...], Any] = {}


def _row_type(fields: tuple[str, ...]) -> Any:
    row_type = _ROW_TYPES.get(fields)
    if row_type is None:
        row_type = _ROW_TYPES[fields] = namedtuple("Row", fields)  # type: ignore[misc]
    return row_type


class Database:
    """Runs transactions on the configured database (see the module docstring)."""

    def __init__(self, url: str, *, pool_size: int = 10, echo: bool = False) -> None:
        """Create the engine for `url` (an async SQLAlchemy URL, or any SQLite URL)."""
        self.url = url
        self.echo = echo
        self.sync_engine: sa.Engine | None = None
        self.async_engine: AsyncEngine | None = None
        self._sqlite_fairy: Any = None
        self._sqlite_tx: Tx | None = None
        if is_sqlite_url(url):
            # One connection, shared by the migrations and the requests: SQLite serialises
            # writers anyway, every transaction runs to completion without yielding, and an
            # in-memory database exists only within its connection.
            self.sync_engine = sa.create_engine(
                sqlite_sync_url(url),
                echo=echo,
                poolclass=sa.pool.StaticPool,
                connect_args={"check_same_thread": False, "timeout": 30},
            )
            _tune_sqlite(self.sync_engine)
            self.integrity_errors: tuple[type[BaseException], ...] = (
                sa.exc.IntegrityError,
                self.sync_engine.dialect.loaded_dbapi.IntegrityError,
            )
        else:
            self.async_engine = create_async_engine(
                url,
                echo=echo,
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_timeout=120,
                pool_pre_ping=True,
            )
            self.integrity_errors = (
                sa.exc.IntegrityError,
                self.async_engine.dialect.loaded_dbapi.IntegrityError,
            )

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(tx, *args)` in one transaction; commit on return, roll back on raise."""
        if self.sync_engine is not None:
            tx = self._sqlite_tx or self._open_sqlite()
            cx = tx.dbapi_connection
            cx.execute("BEGIN IMMEDIATE")
            try:
                result = fn(tx, *args)
                cx.execute("COMMIT")
            except BaseException:
                if cx.in_transaction:
                    cx.rollback()
                raise
            return result
        assert self.async_engine is not None
        async with self.async_engine.begin() as aconn:
            return await aconn.run_sync(_in_tx, self.echo, fn, args)

    def _open_sqlite(self) -> Tx:
        assert self.sync_engine is not None
        self._sqlite_fairy = self.sync_engine.raw_connection()
        driver = self._sqlite_fairy.driver_connection
        self._sqlite_tx = Tx(driver, self.sync_engine.dialect, self.echo)
        return self._sqlite_tx

    @property
    def dialect(self) -> sa.Dialect:
        """The SQL dialect of the database."""
        engine = self.sync_engine or self.async_engine
        assert engine is not None
        return engine.dialect

    def prepare(self, statements: list[Statement]) -> None:
        """Compile `statements` now rather than on their first request."""
        for statement in statements:
            statement.compiled(self.dialect)

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema to `revision` in one transaction.

        Safe to run from several processes at once: on PostgreSQL a transaction-scoped advisory
        lock serialises them, on SQLite `BEGIN IMMEDIATE` does.
        """
        if self.sync_engine is not None:
            with self.sync_engine.begin() as conn:
                _upgrade(conn, revision)
            return
        assert self.async_engine is not None
        async with self.async_engine.begin() as aconn:
            await aconn.run_sync(_upgrade, revision)

    async def dispose(self) -> None:
        """Close every connection."""
        if self._sqlite_fairy is not None:
            self._sqlite_fairy.close()
            self._sqlite_fairy = None
            self._sqlite_tx = None
        if self.sync_engine is not None:
            self.sync_engine.dispose()
        if self.async_engine is not None:
            await self.async_engine.dispose()


def _in_tx(conn: sa.Connection, echo: bool, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    return fn(Tx(conn.connection, conn.dialect, echo), *args)


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
