"""Database access: transactions, statements and schema migration.

Concurrency model: every request is one short transaction that first locks the job's row, so
all reads and writes of one job are serialised by the database itself, also across server
processes. On PostgreSQL that lock is `SELECT ... FOR UPDATE`; SQLite has no row locks, so
every transaction starts with `BEGIN IMMEDIATE`, which takes the database's write lock up
front (readers keep going thanks to WAL mode). Registration relies on the primary key and
retries on a conflict.

Execution model: a transaction is one coroutine function over a `Tx`, which executes
SQLAlchemy Core statements compiled once per dialect (`Statement`) directly on the driver.
SQLAlchemy's per-execution machinery (cache key, execution context, result wrapping,
transaction events, and on PostgreSQL its greenlet bridge to asyncpg) cost more CPU than the
statements themselves.

- PostgreSQL: an asyncpg connection pool; asyncpg prepares each statement once per connection.
- SQLite: one long-lived `sqlite3` connection used on the event loop thread, with
  `BEGIN IMMEDIATE` ... `COMMIT` issued by hand. A statement on a local file takes
  microseconds, far less than the two thread hops per statement aiosqlite would cost, and with
  one connection per process the requests would queue for it anyway. The transaction
  coroutine must therefore run to completion without suspending (nothing else may use the
  connection meanwhile); `Database.run` enforces that. The price is that a process waiting
  for another process's SQLite write lock stalls its loop; deployments with several server
  processes should use PostgreSQL.

Migrations (Alembic) go through ordinary SQLAlchemy connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections import namedtuple
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, TypeVar

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


def asyncpg_dsn(url: str) -> str:
    """The libpq-style DSN asyncpg takes, from an SQLAlchemy PostgreSQL URL."""
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Tx:
    """A transaction in progress on one driver connection, as the service's functions see it."""

    __slots__ = ("connection", "dialect", "echo")

    def __init__(self, connection: Any, dialect: sa.Dialect, echo: bool) -> None:
        """Use `connection`, which the caller has put inside a transaction.

        Statements are compiled for `dialect`; `echo` logs each one.
        """
        self.connection = connection
        self.dialect = dialect
        self.echo = echo

    async def fetch(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        """Execute a query; its rows as tuples."""
        raise NotImplementedError

    async def execute(self, sql: str, args: tuple[Any, ...]) -> int:
        """Execute a statement; the number of rows it changed."""
        raise NotImplementedError


class SqliteTx(Tx):
    """A transaction on a `sqlite3` connection (whose methods never suspend)."""

    __slots__ = ()

    async def fetch(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        """Execute a query; its rows as tuples."""
        return self.connection.execute(sql, args).fetchall()

    async def execute(self, sql: str, args: tuple[Any, ...]) -> int:
        """Execute a statement; the number of rows it changed."""
        return self.connection.execute(sql, args).rowcount


class AsyncpgTx(Tx):
    """A transaction on an asyncpg connection."""

    __slots__ = ()

    async def fetch(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        """Execute a query; its rows as tuples."""
        return await self.connection.fetch(sql, *args)

    async def execute(self, sql: str, args: tuple[Any, ...]) -> int:
        """Execute a statement; the number of rows it changed."""
        status = await self.connection.execute(sql, *args)  # e.g. "UPDATE 1", "INSERT 0 1"
        return int(status.rsplit(" ", 1)[1])


class Statement:
    """A Core statement compiled once per dialect and executed straight on the driver.

    Bind parameters are either named (`sa.bindparam("name")`, given to `run`) or values bound
    in the statement. Only plain column types are bound (str, int, float, bool, None), which
    both drivers take as they are, so SQLAlchemy's type processing is not needed.
    """

    __slots__ = ("stmt", "row_type", "_by_dialect")

    def __init__(self, stmt: Any) -> None:
        """Wrap `stmt` (compiled on first use for each dialect)."""
        self.stmt = stmt
        # Rows of a SELECT allow attribute access by column name.
        self.row_type: Any = None
        if isinstance(stmt, sa.Select):
            names = tuple(c.name for c in stmt.selected_columns)
            self.row_type = namedtuple("Row", names)  # type: ignore[misc]
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

    def _args(self, tx: Tx, params: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        sql, order, literals = self.compiled(tx.dialect)
        values = {**literals, **params} if literals else params
        args = tuple(values[k] for k in order)
        if tx.echo:
            sql_logger.info("%s %r", sql, args)
        return sql, args

    async def run(self, tx: Tx, params: dict[str, Any]) -> int:
        """Execute an INSERT, UPDATE or DELETE; the number of rows it changed."""
        return await tx.execute(*self._args(tx, params))

    async def rows(self, tx: Tx, params: dict[str, Any]) -> list[Any]:
        """Execute a SELECT; its rows."""
        make = self.row_type._make
        return [make(r) for r in await tx.fetch(*self._args(tx, params))]

    async def first(self, tx: Tx, params: dict[str, Any]) -> Any:
        """The first row of a SELECT, or None."""
        rows = await self.rows(tx, params)
        return rows[0] if rows else None


class Database:
    """Runs transactions on the configured database (see the module docstring)."""

    def __init__(self, url: str, *, pool_size: int = 10, echo: bool = False) -> None:
        """Prepare access to `url` (an async SQLAlchemy URL, or any SQLite URL).

        Connections open on first use.
        """
        self.url = url
        self.echo = echo
        self.pool_size = pool_size
        self.sync_engine: sa.Engine | None = None
        self._sqlite_fairy: Any = None
        self._sqlite_tx: SqliteTx | None = None
        self._pg_pool: Any = None
        self._pg_pool_lock: Optional[asyncio.Lock] = None
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
            self.dialect: sa.Dialect = self.sync_engine.dialect
            self.integrity_errors: tuple[type[BaseException], ...] = (
                self.dialect.loaded_dbapi.IntegrityError,
            )
        else:
            from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

            if not sa.make_url(url).get_backend_name() == "postgresql":
                raise ValueError(
                    f"database_url {url!r}: only SQLite and PostgreSQL (asyncpg) are supported"
                )
            import asyncpg

            self.dialect = asyncpg_dialect()
            self.integrity_errors = (asyncpg.IntegrityConstraintViolationError,)

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `await fn(tx, *args)` in one transaction; commit on return, roll back on raise.

        Raises:
            RuntimeError: on SQLite, `fn` suspended (awaited something other than the
                transaction's own statements).

        """
        if self.sync_engine is not None:
            tx = self._sqlite_tx or self._open_sqlite()
            cx = tx.connection
            cx.execute("BEGIN IMMEDIATE")
            try:
                result = _run_without_suspending(fn(tx, *args))
                cx.execute("COMMIT")
            except BaseException:
                if cx.in_transaction:
                    cx.rollback()
                raise
            return result
        pool = self._pg_pool or await self._open_pg_pool()
        async with pool.acquire() as conn, conn.transaction():
            return await fn(AsyncpgTx(conn, self.dialect, self.echo), *args)

    def _open_sqlite(self) -> SqliteTx:
        assert self.sync_engine is not None
        self._sqlite_fairy = self.sync_engine.raw_connection()
        driver = self._sqlite_fairy.driver_connection
        self._sqlite_tx = SqliteTx(driver, self.dialect, self.echo)
        return self._sqlite_tx

    async def _open_pg_pool(self) -> Any:
        import asyncpg

        if self._pg_pool_lock is None:
            self._pg_pool_lock = asyncio.Lock()
        async with self._pg_pool_lock:
            if self._pg_pool is None:
                self._pg_pool = await asyncpg.create_pool(
                    asyncpg_dsn(self.url),
                    min_size=1,
                    max_size=self.pool_size,
                    # Transactions leave no session state behind, so a connection goes back
                    # to the pool without asyncpg's reset query (a round trip per request).
                    # asyncpg still rolls back a transaction left open (a cancelled request)
                    # before calling this; tests/optimizer/batch_size/test_db.py checks it.
                    reset=_keep_session,
                )
        return self._pg_pool

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
        engine: AsyncEngine = create_async_engine(self.url, echo=self.echo, poolclass=sa.NullPool)
        try:
            async with engine.begin() as aconn:
                await aconn.run_sync(_upgrade, revision)
        finally:
            await engine.dispose()

    async def dispose(self) -> None:
        """Close every connection."""
        if self._sqlite_fairy is not None:
            self._sqlite_fairy.close()
            self._sqlite_fairy = None
            self._sqlite_tx = None
        if self.sync_engine is not None:
            self.sync_engine.dispose()
        if self._pg_pool is not None:
            await self._pg_pool.close()
            self._pg_pool = None


async def _keep_session(_connection: Any) -> None:
    return None


def _run_without_suspending(coro: Any) -> Any:
    """Run a coroutine that must complete without suspending; its result."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError(
        "an SQLite transaction function suspended; it may only await its own statements"
    )


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
