"""`server.db`: transactions on SQLite and PostgreSQL, outside the HTTP layer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from bso_helpers import BACKENDS
from bso_helpers import Database as FreshDatabase
from sqlalchemy.ext.asyncio import create_async_engine
from zeus.optimizer.batch_size.server import service
from zeus.optimizer.batch_size.server.db import AsyncpgTx as AsyncpgTxForTest
from zeus.optimizer.batch_size.server.db import Database, Statement, Tx, asyncpg_dsn
from zeus.optimizer.batch_size.server.schema import jobs, metadata


async def _count_jobs(tx: Tx) -> int:
    rows = await Statement(jobs.select()).rows(tx, {})
    return len(rows)


def _job_values(job_id: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "job_id_prefix": "t",
        "batch_sizes": "[32]",
        "default_batch_size": 32,
        "eta_knob": 0.5,
        "beta_knob": 2.0,
        "target_metric": 0.5,
        "higher_is_better_metric": True,
        "max_epochs": 10,
        "num_pruning_rounds": 2,
        "window_size": 5,
        "mab_prior_mean": 0.0,
        "mab_prior_precision": 0.0,
        "mab_num_explorations": 2,
        "mab_seed": 1,
        "max_power": 300.0,
        "number_of_gpus": 1,
        "gpu_model": "A40",
        "stage": "Pruning",
        "min_cost": None,
        "min_cost_batch_size": 32,
        "next_trial_number": 1,
        "rng_state": "{}",
        "created_at": 0.0,
    }


@pytest.mark.parametrize("database", BACKENDS, indirect=True)
def test_commit_rollback_and_integrity_errors(database: FreshDatabase) -> None:
    async def go() -> None:
        db = Database(database.url)
        try:
            await db.migrate()
            await db.run(service._insert_job, _job_values("t-1"))
            # A failing transaction leaves nothing behind, including its earlier statements.
            with pytest.raises(db.integrity_errors):

                async def insert_two(tx: Tx) -> None:
                    await service._insert_job(tx, _job_values("t-2"))
                    await service._insert_job(tx, _job_values("t-1"))

                await db.run(insert_two)
            assert await db.run(_count_jobs) == 1
            assert await db.run(service._delete_job, "t-1") is None
            with pytest.raises(service.ZeusBSONotFoundError, match="unknown job_id 't-1'"):
                await db.run(service._delete_job, "t-1")
            assert await db.run(_count_jobs) == 0
        finally:
            await db.dispose()

    asyncio.run(go())


def test_sqlite_transaction_may_not_suspend(tmp_path: Path) -> None:
    """Others share the one SQLite connection: a suspended transaction could interleave."""

    async def suspends(tx: Tx) -> None:
        await service._insert_job(tx, _job_values("t-1"))
        await asyncio.sleep(0)

    async def go() -> int:
        db = Database(f"sqlite:///{tmp_path / 'x.db'}")
        try:
            await db.migrate()
            with pytest.raises(RuntimeError, match="suspended"):
                await db.run(suspends)
            return await db.run(_count_jobs)
        finally:
            await db.dispose()

    assert asyncio.run(go()) == 0


def test_in_memory_sqlite_keeps_its_schema(tmp_path: Path) -> None:
    async def go() -> int:
        db = Database("sqlite+aiosqlite://")
        try:
            await db.migrate()
            await db.run(service._insert_job, _job_values("t-1"))
            return await db.run(_count_jobs)
        finally:
            await db.dispose()

    assert asyncio.run(go()) == 1


def test_urls() -> None:
    assert (
        asyncpg_dsn("postgresql+asyncpg://u:p%40ss@h:5433/db?ssl=require")
        == "postgresql://u:p%40ss@h:5433/db?ssl=require"
    )
    with pytest.raises(ValueError, match="'mysql://h/db': only SQLite and PostgreSQL"):
        Database("mysql://h/db")


@pytest.mark.parametrize("database", ["postgres"], indirect=True)
def test_pg_connection_left_in_a_transaction_is_rolled_back(database: FreshDatabase) -> None:
    """A request cancelled mid-transaction must not hand the next one an open transaction."""

    async def go() -> int:
        db = Database(database.url, pool_size=1)  # One connection: the next run reuses it.
        try:
            await db.migrate()
            pool = await db._open_pg_pool()
            async with pool.acquire() as conn:
                await conn.execute("BEGIN")
                await service._insert_job(
                    AsyncpgTxForTest(conn, db.dialect, False), _job_values("t-lost")
                )
            await db.run(service._insert_job, _job_values("t-1"))
            return await db.run(_count_jobs)
        finally:
            await db.dispose()

    assert asyncio.run(go()) == 1  # t-lost was rolled back, t-1 committed.


# A trial as the baseline revision stores it (today's insert names later columns too).
_INS_BASELINE_TRIAL = Statement(
    sa.text(
        "INSERT INTO bso_trial (job_id, trial_number, batch_size, type, status, "
        "start_timestamp, report_count) VALUES (:b_job, 1, 32, 'Exploration', 'Dispatched', 0, 0)"
    )
)


async def _insert_trial(tx: Tx, job_id: str) -> None:
    await _INS_BASELINE_TRIAL.run(tx, {"b_job": job_id})


def _schema_diff(connection: sa.Connection) -> list[Any]:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    return compare_metadata(MigrationContext.configure(connection), metadata)


@pytest.mark.parametrize("database", BACKENDS, indirect=True)
def test_migrations_build_the_schema_and_upgrade_old_databases(database: FreshDatabase) -> None:
    """The revisions create exactly `schema.py`'s tables; a baseline database upgrades."""

    async def go() -> list[Any]:
        db = Database(database.url)
        try:
            await db.migrate("0001_baseline")
            await db.run(service._insert_job, _job_values("t-1"))
            await db.run(_insert_trial, "t-1")
            await db.migrate()
            if db.sync_engine is not None:
                with db.sync_engine.connect() as conn:
                    return _schema_diff(conn)
            engine = create_async_engine(database.url)
            try:
                async with engine.connect() as conn:
                    return await conn.run_sync(_schema_diff)
            finally:
                await engine.dispose()
        finally:
            await db.dispose()

    assert asyncio.run(go()) == []
    assert database.query("SELECT job_id FROM bso_job") == [("t-1",)]
    # A trial from before the revisions has no end message (and still answers, the old way)
    # and no request id.
    assert database.query("SELECT trial_number, end_message, request_id FROM bso_trial") == [
        (1, None, None)
    ]
