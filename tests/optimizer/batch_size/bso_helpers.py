"""Helpers of the batch size optimizer tests: real server processes on SQLite and PostgreSQL.

The server always runs as a real `uvicorn` process on 127.0.0.1 with a free port; tests talk
to it over HTTP and inspect the database directly. PostgreSQL variants need
`ZEUS_BSO_TEST_POSTGRES_URL` (e.g. `export ZEUS_BSO_TEST_POSTGRES_URL="$(.ci/postgres.sh)"`);
without it they skip. Each PostgreSQL user of these fixtures gets a fresh database.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

PG_ENV = "ZEUS_BSO_TEST_POSTGRES_URL"
BACKENDS = ["sqlite", "postgres"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m zeus.optimizer.batch_size.server` as a child process."""

    def __init__(
        self,
        database_url: str,
        port: int | None = None,
        env: dict[str, str] | None = None,
        cmd: list[str] | None = None,
    ) -> None:
        self.database_url = database_url
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(f"/tmp/zeus-bso-test-server-{self.port}.log")
        self.cmd = cmd

    def start(self) -> ServerProcess:
        cmd = self.cmd or [
            sys.executable,
            "-m",
            "zeus.optimizer.batch_size.server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--database-url",
            self.database_url,
        ]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()}"
                )
            try:
                httpx.get(f"{self.base_url}/openapi.json", timeout=1.0)
                return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"server did not come up:\n{self.log_path.read_text()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flushing, like a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _pg_admin(url: str, sql: str) -> None:
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text(sql))
    finally:
        await engine.dispose()


class Database:
    """A fresh database of one backend, with a helper to query it."""

    def __init__(self, backend: str, tmp_path: Path) -> None:
        self.backend = backend
        self._drop: str | None = None
        if backend == "sqlite":
            self.url = f"sqlite+aiosqlite:///{tmp_path / 'bso.db'}"
            return
        base = os.environ.get(PG_ENV)
        if not base:
            pytest.skip(f"PostgreSQL variant: set {PG_ENV} (e.g. from .ci/postgres.sh)")
        name = f"bso_test_{uuid.uuid4().hex[:12]}"
        asyncio.run(_pg_admin(base, f'CREATE DATABASE "{name}"'))
        self._base = base
        self._drop = name
        self.url = base.rsplit("/", 1)[0] + "/" + name

    def migrate(self) -> None:
        """Run the documented migration command."""
        subprocess.run(
            [sys.executable, "-m", "zeus.optimizer.batch_size.server", "migrate"],
            env={**os.environ, "ZEUS_BSO_DATABASE_URL": self.url},
            check=True,
            capture_output=True,
        )

    def query(self, sql: str, **params: Any) -> list[tuple]:
        async def run() -> list[tuple]:
            engine = create_async_engine(self.url)
            try:
                async with engine.connect() as conn:
                    return [tuple(r) for r in await conn.execute(sa.text(sql), params)]
            finally:
                await engine.dispose()

        return asyncio.run(run())

    def close(self) -> None:
        if self._drop:
            asyncio.run(
                _pg_admin(self._base, f'DROP DATABASE IF EXISTS "{self._drop}" WITH (FORCE)')
            )


def job_spec(**overrides: Any) -> dict[str, Any]:
    """The reference tests' fake job (`get_fake_job_config`), with a unique job id."""
    spec: dict[str, Any] = {
        "job_id": f"test-{uuid.uuid4().hex[:10]}",
        "job_id_prefix": "test",
        "default_batch_size": 1024,
        "batch_sizes": [32, 64, 256, 512, 1024, 4096, 2048],
        "eta_knob": 0.5,
        "beta_knob": 2.0,
        "target_metric": 0.5,
        "higher_is_better_metric": True,
        "max_epochs": 100,
        "num_pruning_rounds": 2,
        "window_size": 5,
        "mab_prior_mean": 0.0,
        "mab_prior_precision": 0.0,
        "mab_seed": 123456,
        "mab_num_explorations": 2,
        "max_power": 3000,
        "number_of_gpus": 4,
        "gpu_model": "A100",
    }
    spec.update(overrides)
    return spec
