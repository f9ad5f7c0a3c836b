"""Alembic environment of the batch size optimizer server.

Normally run through `zeus-bso-server migrate` (or at start-up), which hands over an open
connection in `config.attributes["connection"]`. Running `alembic` directly also works: the URL
then comes from `sqlalchemy.url` or `ZEUS_BSO_DATABASE_URL`.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection
from zeus.optimizer.batch_size.server.schema import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_own_engine() -> None:
    from zeus.optimizer.batch_size.server.config import ZeusBsoSettings
    from zeus.optimizer.batch_size.server.db import Database

    db = Database(config.get_main_option("sqlalchemy.url") or ZeusBsoSettings().database_url)
    try:
        await db.migrate()
    finally:
        await db.dispose()


if context.is_offline_mode():
    _run_offline()
elif "connection" in config.attributes:
    _run(config.attributes["connection"])
else:
    asyncio.run(_run_with_own_engine())
