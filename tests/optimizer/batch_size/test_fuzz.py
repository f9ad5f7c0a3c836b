"""Schemathesis against the batch size optimizer server: on SQLite with a token, on PostgreSQL
without one (it skips without `ZEUS_BSO_TEST_POSTGRES_URL`). See `tests/openapi_fuzz.py`.

Two rules of the API are beyond JSON Schema: a job's `default_batch_size` is one of its
`batch_sizes`, and its `job_id` starts with `job_id_prefix`. Schema-valid registrations are
made to follow them before they are sent (schema-invalid ones are sent as generated), so that
the check that valid data is accepted holds the server to everything else. Half of the
schema-valid predictions, reports and trial ends (picked by a hash of the request) name a job
registered beforehand, so the fuzzing reaches past the job look-up.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from bso_helpers import Database, ServerProcess, job_spec
from openapi_fuzz import FUZZ_TIMEOUT_S, is_positive, load
from zeus.optimizer.batch_size.server.app import create_app
from zeus.optimizer.batch_size.server.config import ZeusBsoSettings

TOKEN = "fuzz-t0ken"
KNOWN_JOB = "fuzz-known"


def _document(token: str | None) -> dict[str, Any]:
    return create_app(ZeusBsoSettings(database_url="sqlite://", token=token)).openapi


with_token = load(_document(TOKEN))
without_token = load(_document(None))


def _serve(backend: str, tmp: Path, token: str | None) -> Iterator[tuple[str, dict[str, str]]]:
    db = Database(backend, tmp)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        if backend == "postgres":
            db.migrate()
        srv = ServerProcess(db.url, env={"ZEUS_BSO_TOKEN": token or ""}).start()
        try:
            spec = job_spec(job_id=KNOWN_JOB, job_id_prefix="fuzz", batch_sizes=[1, 2, 3])
            spec["default_batch_size"] = 2
            r = httpx.post(f"{srv.base_url}/jobs", json=spec, headers=headers)
            assert r.status_code == 201, r.text
            yield srv.base_url, headers
        finally:
            srv.stop()
    finally:
        db.close()


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    yield from _serve("sqlite", tmp_path_factory.mktemp("fuzz-sqlite"), TOKEN)


@pytest.fixture(scope="module")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    yield from _serve("postgres", tmp_path_factory.mktemp("fuzz-pg"), None)


def _follow_cross_field_rules(case: Any) -> None:
    """Make a schema-valid request follow the rules JSON Schema cannot state (module doc)."""
    body = case.body
    path = case.operation.path
    if case.method == "POST" and path == "/jobs":
        body["default_batch_size"] = body["batch_sizes"][0]
        if body.get("job_id") is not None:
            body["job_id"] = (body["job_id_prefix"] + body["job_id"])[:400]
        return
    target = case.query if case.method == "GET" else body
    if case.method == "DELETE" or zlib.crc32(repr(target).encode()) % 2:
        return
    target["job_id"] = KNOWN_JOB
    if "trial_number" in target:
        # Trials 1-4 exist once the fuzzing's predictions have run.
        target["trial_number"] = 1 + target["trial_number"] % 4


def _fuzz(case: Any, server: tuple[str, dict[str, str]]) -> None:
    base_url, headers = server
    if is_positive(case):
        _follow_cross_field_rules(case)
    case.call_and_validate(base_url=base_url, headers=headers)


@pytest.mark.timeout(FUZZ_TIMEOUT_S)
@with_token.parametrize()
def test_fuzz_sqlite_with_token(case: Any, sqlite_server: tuple[str, dict[str, str]]) -> None:
    _fuzz(case, sqlite_server)


@pytest.mark.timeout(FUZZ_TIMEOUT_S)
@without_token.parametrize()
def test_fuzz_postgres(case: Any, postgres_server: tuple[str, dict[str, str]]) -> None:
    _fuzz(case, postgres_server)
