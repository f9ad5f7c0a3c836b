"""The per-epoch endpoints' short path answers exactly as the FastAPI routes do; keep-alive policy.

In-process (httpx over ASGI), so each request can be sent once through `BsoApp.__call__` and
once straight to FastAPI's own `__call__`, on two databases that saw the same requests.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
import pytest
from bso_helpers import job_spec
from fastapi import FastAPI
from hypothesis import given
from hypothesis import strategies as st
from zeus.optimizer.batch_size.server.app import create_app
from zeus.optimizer.batch_size.server.config import ZeusBsoSettings
from zeus.optimizer.batch_size.server.hot_path import MAX_REPORT_BODY_BYTES, BsoApp
from zeus.optimizer.batch_size.server.keepalive import KeepAlivePolicy


class Served:
    """An app with its database open, and a client that reaches it through `entry`."""

    def __init__(self, app: BsoApp, entry: Callable[..., Any], client: Any = ("127.0.0.1", 1)):
        self.app = app
        transport = httpx.ASGITransport(app=entry, client=client)
        self.http = httpx.AsyncClient(transport=transport, base_url="http://bso")


@asynccontextmanager
async def _open(tmp: Path, name: str, *, hot: bool, **settings: Any) -> AsyncIterator[Served]:
    app = create_app(ZeusBsoSettings(database_url=f"sqlite:///{tmp / name}.db", **settings))

    async def fastapi_only(scope: Any, receive: Any, send: Any) -> None:
        await FastAPI.__call__(app, scope, receive, send)

    async with app.router.lifespan_context(app):
        served = Served(app, app if hot else fastapi_only)
        yield served
        await served.http.aclose()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _report_body(trial: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    body = dict(trial, time=10.0, energy=5000.0, metric=0.6, current_epoch=1)
    body.update(overrides)
    return body


async def _script(http: httpx.AsyncClient) -> list[tuple[int, Any]]:
    """Drive one job through pruning into the bandit, with every kind of bad request mixed in."""
    out: list[tuple[int, Any]] = []

    async def send(method: str, url: str, **kwargs: Any) -> httpx.Response:
        r = await http.request(method, url, **kwargs)
        out.append((r.status_code, r.json()))
        return r

    spec = job_spec(job_id="test-parity", num_pruning_rounds=1, batch_sizes=[32, 64, 128])
    spec["default_batch_size"] = 64
    await send("POST", "/jobs", json=spec)
    await send("GET", "/jobs/batch_size", params={"job_id": "test-unknown"})
    await send("GET", "/jobs/batch_size", params={"job_id": ""})
    await send("GET", "/jobs/batch_size")  # Missing parameter: FastAPI answers on both paths.
    for cycle in range(8):
        r = await send("GET", "/jobs/batch_size", params={"job_id": "test-parity"})
        trial = r.json()
        if cycle == 0:
            raw = json.dumps(_report_body(trial)).encode()
            for bad in (
                _report_body(trial, job_id="test-unknown"),
                _report_body(trial, trial_number=99),
                _report_body(trial, batch_size=33),
                _report_body(trial, batch_size=128),
                _report_body(trial, time=-1.0),
                _report_body(trial, current_epoch="one"),
                {k: v for k, v in _report_body(trial).items() if k != "metric"},
                [1, 2, 3],
            ):
                await send("POST", "/report", json=bad)
            await send("POST", "/report", content=raw.replace(b"5000.0", b"NaN"))
            await send("POST", "/report", content=raw.replace(b"10.0", b"Infinity"))
            await send("POST", "/report", content=raw[:-3])
            await send("POST", "/report", content=b"\xff\xfe")
            await send("POST", "/report", json=_report_body(trial, metric=0.1))  # Keep going.
        # Cheaper batch sizes converge; the default one is the most expensive.
        energy = 1000.0 + 100.0 * trial["batch_size"]
        await send("POST", "/report", json=_report_body(trial, energy=energy))
        await send("POST", "/report", json=_report_body(trial, energy=energy))  # Already in.
    return out


def test_hot_path_answers_as_fastapi_does(tmp_path: Path) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        results = []
        for hot in (True, False):
            async with _open(tmp_path, f"hot{hot}", hot=hot) as served:
                results.append(await _script(served.http))
        return results[0], results[1]

    hot, slow = run(both())
    assert len(hot) == len(slow) > 40
    for i, (a, b) in enumerate(zip(hot, slow)):
        assert a == b, f"request {i}: hot path {a} != FastAPI {b}"
    assert {status for status, _ in hot} == {200, 201, 400, 422}
    # The script reached the bandit stage, so both paths ran the whole decision logic.
    for hot_db in (True, False):
        with sqlite3.connect(tmp_path / f"hot{hot_db}.db") as db:
            assert db.execute("SELECT stage FROM bso_job").fetchall() == [("MAB",)]
            assert db.execute("SELECT count(*) FROM bso_arm").fetchall() == [(3,)]


def test_oversized_report_is_413_and_closes(tmp_path: Path) -> None:
    async def go() -> httpx.Response:
        async with _open(tmp_path, "big", hot=True) as served:
            body = b'{"pad": "' + b"x" * MAX_REPORT_BODY_BYTES + b'"}'
            return await served.http.post("/report", content=body)

    r = run(go())
    assert r.status_code == 413
    assert str(MAX_REPORT_BODY_BYTES) in r.json()["message"]
    assert r.headers["connection"] == "close"


def test_token_checked_on_hot_path(tmp_path: Path) -> None:
    async def go() -> list[int]:
        codes = []
        async with _open(tmp_path, "auth", hot=True, token="s3cret") as served:
            ok = {"Authorization": "Bearer s3cret"}
            spec = job_spec()
            assert (await served.http.post("/jobs", json=spec, headers=ok)).status_code == 201
            trial = {"job_id": spec["job_id"], "batch_size": 1024, "trial_number": 1}
            for headers in ({}, {"Authorization": "Bearer s3cre"}, ok):
                r = await served.http.get(
                    "/jobs/batch_size", params={"job_id": spec["job_id"]}, headers=headers
                )
                codes.append(r.status_code)
                r = await served.http.post("/report", json=_report_body(trial), headers=headers)
                codes.append(r.status_code)
        return codes

    assert run(go()) == [401, 401, 401, 401, 200, 200]


def test_connection_close_once_busy(tmp_path: Path) -> None:
    """With max_keepalive=2, a third connection makes every response close its connection."""

    async def go() -> list[str | None]:
        seen = []
        async with _open(tmp_path, "ka", hot=True, max_keepalive=2) as served:
            spec = job_spec()
            await served.http.post("/jobs", json=spec)
            for port in (1, 2, 1, 3, 1):
                transport = httpx.ASGITransport(app=served.app, client=("127.0.0.1", port))
                async with httpx.AsyncClient(transport=transport, base_url="http://bso") as c:
                    r = await c.get("/jobs/batch_size", params={"job_id": spec["job_id"]})
                    seen.append(r.headers.get("connection"))
                    r = await c.get("/openapi.json")  # The FastAPI path is covered too.
                    seen.append(r.headers.get("connection"))
        return seen

    assert run(go()) == [None, None, None, None, None, None, "close", "close", "close", "close"]


# -- KeepAlivePolicy -------------------------------------------------------------------------


def test_policy_keeps_a_lone_client_and_closes_a_crowd() -> None:
    policy = KeepAlivePolicy(2, window=5.0)
    assert all(policy.keep(("h", 1), now=t) for t in range(100))
    assert policy.keep(("h", 2), now=100.0)
    assert not policy.keep(("h", 3), now=100.5)
    assert not policy.keep(("h", 1), now=101.0)  # Busy: everybody closes.
    # Once ports 2 and 3 have been quiet for the window, port 1 is alone again.
    assert policy.keep(("h", 1), now=105.6)
    assert policy.active_connections() == 1
    assert not KeepAlivePolicy(0).keep(("h", 1))
    one = KeepAlivePolicy(1)
    assert one.keep(("h", 1))
    assert one.keep(["h", 1])  # A list-shaped pair is the same connection.


def test_policy_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="max_connections must be >= 0, got -1"):
        KeepAlivePolicy(-1)
    with pytest.raises(ValueError, match="window must be > 0, got 0"):
        KeepAlivePolicy(1, window=0)


@given(
    max_connections=st.integers(0, 4),
    events=st.lists(st.tuples(st.integers(0, 6), st.floats(0.0, 3.0)), max_size=60),
)
def test_policy_counts_distinct_recent_connections(
    max_connections: int, events: list[tuple[int, float]]
) -> None:
    """keep() is true iff at most `max` distinct peers sent requests within the window."""
    window = 2.0
    policy = KeepAlivePolicy(max_connections, window=window)
    now = 0.0
    last: dict[int, float] = {}
    for port, gap in events:
        now += gap
        last[port] = now
        recent = {p for p, t in last.items() if t > now - window}
        assert policy.keep(("h", port), now=now) == (len(recent) <= max_connections)
        assert policy.active_connections() == len(recent)
