"""The application in-process (httpx over ASGI): the one dispatcher, its OpenAPI document,
auth, body limits, lifespan and keep-alive policy.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
from bso_helpers import job_spec
from hypothesis import given
from hypothesis import strategies as st
from zeus.optimizer.batch_size.server.app import MAX_BODY_BYTES, ROUTES, BsoApp, create_app
from zeus.optimizer.batch_size.server.config import ZeusBsoSettings
from zeus.optimizer.batch_size.server.errors import ErrorBody
from zeus.optimizer.batch_size.server.keepalive import KeepAlivePolicy


def client(app: BsoApp, port: int = 1) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", port))
    return httpx.AsyncClient(transport=transport, base_url="http://bso")


@asynccontextmanager
async def _open(tmp: Path, **settings: Any) -> AsyncIterator[tuple[BsoApp, httpx.AsyncClient]]:
    app = create_app(ZeusBsoSettings(database_url=f"sqlite:///{tmp / 'bso'}.db", **settings))
    async with app.running(), client(app) as http:
        yield app, http


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _report_body(trial: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    body = dict(trial, time=10.0, energy=5000.0, metric=0.6, current_epoch=1)
    body.update(overrides)
    return body


async def _script(http: httpx.AsyncClient) -> list[tuple[str, str, httpx.Response]]:
    """Drive one job through pruning into the bandit, with every kind of bad request mixed in."""
    out: list[tuple[str, str, httpx.Response]] = []

    async def send(method: str, url: str, **kwargs: Any) -> httpx.Response:
        r = await http.request(method, url, **kwargs)
        out.append((method, url, r))
        return r

    spec = job_spec(job_id="test-script", num_pruning_rounds=1, batch_sizes=[32, 64, 128])
    spec["default_batch_size"] = 64
    await send("POST", "/jobs", json=spec)
    await send("POST", "/jobs", json=spec)
    await send("POST", "/jobs", json={**spec, "eta_knob": 0.9})
    await send("POST", "/jobs", json={**spec, "batch_sizes": []})
    await send("GET", "/jobs/batch_size", params={"job_id": "test-unknown"})
    await send("GET", "/jobs/batch_size", params={"job_id": ""})
    await send("GET", "/jobs/batch_size")
    for cycle in range(8):
        r = await send("GET", "/jobs/batch_size", params={"job_id": "test-script"})
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
            await send("POST", "/report", json=_report_body(trial, metric=0.1, current_epoch=2))
            await send("POST", "/report", json=_report_body(trial, metric=0.1, current_epoch=1))
            await send("PATCH", "/trials", json=dict(trial, batch_size=32))
            await send("PATCH", "/trials", json=dict(trial, trial_number=77))
        # Cheaper batch sizes converge; the default one is the most expensive.
        energy = 1000.0 + 100.0 * trial["batch_size"]
        body = _report_body(trial, energy=energy, current_epoch=3)
        await send("POST", "/report", json=body)
        await send("POST", "/report", json=body)  # Already in.
        await send("PATCH", "/trials", json=trial)
    await send("DELETE", "/jobs", params={"job_id": "test-script"})
    await send("DELETE", "/jobs", params={"job_id": "test-script"})
    return out


def test_every_answer_is_declared_in_the_openapi_document(tmp_path: Path) -> None:
    """Each status the script met is declared for its operation; every error is one shape."""

    async def go() -> tuple[dict[str, Any], list[tuple[str, str, httpx.Response]]]:
        async with _open(tmp_path) as (app, http):
            document = (await http.get("/openapi.json")).json()
            return document, await _script(http)

    document, answers = run(go())
    seen = set()
    for method, url, r in answers:
        declared = document["paths"][url][method.lower()]["responses"]
        assert str(r.status_code) in declared, (method, url, r.status_code, r.text)
        seen.add((method, url, r.status_code))
        if r.status_code >= 400:
            body = ErrorBody.model_validate(r.json())
            assert body.detail and body.detail[0].loc[0] in ("body", "query")
    assert {status for _, _, status in seen} == {200, 201, 404, 409, 422}
    # The script reached the bandit stage and deleted the job.
    assert ("DELETE", "/jobs", 404) in seen
    # Every route is documented with every status it declares in the route table.
    for route in ROUTES:
        responses = document["paths"][route.path][route.method.lower()]["responses"]
        statuses = {s for s, _, _ in route.answers} | set(route.errors)
        assert set(responses) == {str(s) for s in statuses}
        for status in route.errors:
            assert responses[str(status)]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorBody"
            }


def test_openapi_states_the_ranges() -> None:
    document = create_app(ZeusBsoSettings(database_url="sqlite://")).openapi
    schemas = document["components"]["schemas"]
    job = schemas["JobSpecFromClient"]["properties"]
    assert job["batch_sizes"]["minItems"] == 1
    assert job["batch_sizes"]["maxItems"] == 1024
    assert job["batch_sizes"]["uniqueItems"] is True
    assert job["batch_sizes"]["items"]["maximum"] == 2**31 - 1
    assert job["max_epochs"] == {**job["max_epochs"], "minimum": 1, "maximum": 2**31 - 1}
    assert job["gpu_model"]["maxLength"] == 300
    assert job["gpu_model"]["pattern"] == "^[^\\x00]*$"
    query, request = document["paths"]["/jobs/batch_size"]["get"]["parameters"]
    assert query["required"] is True
    assert query["schema"]["minLength"] == 1 and query["schema"]["maxLength"] == 400
    assert request["name"] == "request_id" and request["required"] is False
    assert request["schema"]["maxLength"] == 64
    report = schemas["TrainingResult"]["properties"]
    assert report["current_epoch"]["maximum"] == 2**31 - 1
    assert "security" not in document


@pytest.mark.parametrize(
    ("method", "url"), [("POST", "/jobs"), ("POST", "/report"), ("PATCH", "/trials")]
)
def test_oversized_body_is_413_and_closes(tmp_path: Path, method: str, url: str) -> None:
    async def go() -> httpx.Response:
        async with _open(tmp_path) as (_, http):
            body = b'{"pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
            return await http.request(method, url, content=body)

    r = run(go())
    assert r.status_code == 413
    assert str(MAX_BODY_BYTES) in r.json()["message"]
    assert r.json()["detail"][0]["loc"] == ["body"]
    assert r.headers["connection"] == "close"


def test_unknown_paths_and_methods(tmp_path: Path) -> None:
    async def go() -> list[httpx.Response]:
        async with _open(tmp_path) as (_, http):
            return [
                await http.get("/nowhere"),
                await http.put("/jobs"),
                await http.post("/jobs/batch_size"),
                await http.post("/docs"),
            ]

    missing, put, post, docs = run(go())
    assert missing.status_code == 404 and missing.json()["detail"][0]["loc"] == ["path"]
    assert (put.status_code, put.headers["allow"]) == (405, "DELETE, POST")
    assert (post.status_code, post.headers["allow"]) == (405, "GET")
    assert (docs.status_code, docs.headers["allow"]) == (405, "GET, HEAD")


def test_token_covers_everything_and_the_scheme_is_case_insensitive(tmp_path: Path) -> None:
    async def go(public_docs: bool) -> dict[str, list[int]]:
        codes: dict[str, list[int]] = {}
        async with _open(tmp_path, token="s3cret", public_docs=public_docs) as (app, http):
            spec = job_spec()
            assert app.openapi["security"] == [{"bearerAuth": []}]
            for scheme in ("Bearer", "bearer", "BEARER", "BeArEr"):
                r = await http.post(
                    "/jobs", json=spec, headers={"Authorization": f"{scheme} s3cret"}
                )
                assert r.status_code in (200, 201), scheme
            trial = {"job_id": spec["job_id"], "batch_size": 1024, "trial_number": 1}
            for name, headers in (
                ("none", {}),
                ("wrong", {"Authorization": "Bearer s3cre"}),
                ("longer", {"Authorization": "Bearer s3crett"}),
                ("no scheme", {"Authorization": "s3cret"}),
                ("other scheme", {"Authorization": "Token s3cret"}),
                ("ok", {"Authorization": "bearer  s3cret"}),
            ):
                codes[name] = [
                    (await http.request(method, url, headers=headers, **kw)).status_code
                    for method, url, kw in (
                        ("GET", "/jobs/batch_size", {"params": {"job_id": spec["job_id"]}}),
                        ("POST", "/report", {"json": _report_body(trial)}),
                        ("GET", "/openapi.json", {}),
                        ("GET", "/docs", {}),
                        ("GET", "/redoc", {}),
                        ("GET", "/nowhere", {}),
                    )
                ]
        return codes

    private = run(go(False))
    refused = [401] * 6
    assert private == {
        "none": refused,
        "wrong": refused,
        "longer": refused,
        "no scheme": refused,
        "other scheme": refused,
        "ok": [200, 200, 200, 200, 200, 404],
    }
    # ZEUS_BSO_PUBLIC_DOCS: the documentation without the token, nothing else.
    public = run(go(True))
    assert public["none"] == [401, 401, 200, 200, 200, 401]
    assert public["ok"] == [200, 200, 200, 200, 200, 404]


def test_settings_refuse_a_token_a_header_cannot_carry() -> None:
    for bad in (" s3cret", "s3cret\n", "sécret"):
        with pytest.raises(ValueError, match="printable ASCII"):
            ZeusBsoSettings(token=bad)
    assert ZeusBsoSettings(token="").token is None  # Empty means no auth, as before.


def test_lifespan_reports_a_failed_start(tmp_path: Path) -> None:
    """uvicorn must stop, not serve without a database, when the start-up fails."""
    app = create_app(ZeusBsoSettings(database_url=f"sqlite:///{tmp_path}/no/such/dir/x.db"))
    sent: list[dict[str, Any]] = []

    async def go() -> None:
        messages = iter([{"type": "lifespan.startup"}])

        async def receive() -> dict[str, Any]:
            return next(messages)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app({"type": "lifespan"}, receive, send)

    with pytest.raises(Exception, match="unable to open database"):
        run(go())
    assert [m["type"] for m in sent] == ["lifespan.startup.failed"]
    assert app.service is None


def test_connection_close_once_busy(tmp_path: Path) -> None:
    """With max_keepalive=2, a third connection makes every response close its connection."""

    async def go() -> list[str | None]:
        seen = []
        async with _open(tmp_path, max_keepalive=2) as (app, http):
            spec = job_spec()
            await http.post("/jobs", json=spec)
            for port in (1, 2, 1, 3, 1):
                async with client(app, port) as c:
                    r = await c.get("/jobs/batch_size", params={"job_id": spec["job_id"]})
                    seen.append(r.headers.get("connection"))
                    r = await c.get("/openapi.json")  # The documentation too.
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
