"""Black-box HTTP tests of the batch size optimizer server (real uvicorn, SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional

import httpx
import pytest
from bso_helpers import BACKENDS, Database, ServerProcess, free_port, job_spec

MAX_POWER = 3000


@pytest.fixture
def server(shared_server: tuple[ServerProcess, Database]) -> ServerProcess:
    return shared_server[0]


@pytest.fixture
def db(shared_server: tuple[ServerProcess, Database]) -> Database:
    return shared_server[1]


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        yield c


def energy_for(cost: float, time: float = 1.0) -> float:
    """Energy giving this Zeus cost with eta 0.5 and max power 3000 W."""
    return (cost - 0.5 * MAX_POWER * time) / 0.5


def register(http: httpx.Client, **overrides: Any) -> dict[str, Any]:
    r = http.post("/jobs", json=job_spec(**overrides))
    assert r.status_code == 201, r.text
    return r.json()


def predict(http: httpx.Client, job_id: str, request_id: Optional[str] = None) -> dict[str, Any]:
    params = (
        {"job_id": job_id} if request_id is None else {"job_id": job_id, "request_id": request_id}
    )
    r = http.get("/jobs/batch_size", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def predict_at_once(
    server: ServerProcess, job_id: str, request_ids: list[Optional[str]]
) -> list[int]:
    """Trial numbers of predictions sent 16 at a time, each on its own connection."""

    def one(request_id: Optional[str]) -> int:
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            return int(predict(c, job_id, request_id)["trial_number"])

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, request_ids))


def report(
    http: httpx.Client,
    trial: dict[str, Any],
    cost: float,
    *,
    metric: float = 0.6,
    epoch: int = 1,
) -> dict[str, Any]:
    body = dict(trial, time=1.0, energy=energy_for(cost), metric=metric, current_epoch=epoch)
    r = http.post("/report", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def trial_rows(db: Database, job_id: str) -> list[tuple]:
    return db.query(
        "SELECT trial_number, batch_size, type, status, converged, report_count "
        "FROM bso_trial WHERE job_id = :j ORDER BY trial_number",
        j=job_id,
    )


# -- registration ----------------------------------------------------------------------------


def test_register_new_identical_and_conflicting(http: httpx.Client, db: Database) -> None:
    spec = job_spec(error=True, seed=3)  # Unknown keys (the reference tests send some) are ignored.
    r = http.post("/jobs", json=spec)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["job_id"] == spec["job_id"]
    assert created["batch_sizes"] == sorted(spec["batch_sizes"])
    assert "error" not in created

    r = http.post("/jobs", json=spec)
    assert r.status_code == 200
    assert r.json() == created

    r = http.post("/jobs", json={**spec, "default_batch_size": 512})
    assert r.status_code == 409
    assert "default_batch_size" in r.json()["message"]
    rows = db.query("SELECT default_batch_size FROM bso_job WHERE job_id = :j", j=spec["job_id"])
    assert rows == [(1024,)]


def test_register_generates_job_id_from_prefix(http: httpx.Client) -> None:
    ids = set()
    for _ in range(3):
        r = http.post("/jobs", json=job_spec(job_id=None, job_id_prefix="gen"))
        assert r.status_code == 201, r.text
        ids.add(r.json()["job_id"])
    assert len(ids) == 3
    assert all(i.startswith("gen-") for i in ids)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"default_batch_size": 128}, "default_batch_size"),  # not in the list
        ({"default_batch_size": 0}, "default_batch_size"),
        ({"batch_sizes": [0, 1024]}, "batch_sizes"),
        ({"batch_sizes": []}, "batch_sizes"),
        ({"batch_sizes": [1024, 1024]}, "batch_sizes"),
        ({"max_epochs": 0}, "max_epochs"),
        ({"eta_knob": 1.1}, "eta_knob"),
        ({"eta_knob": -0.1}, "eta_knob"),
        ({"beta_knob": 0}, "beta_knob"),
        ({"beta_knob": -2.0}, "beta_knob"),
        ({"num_pruning_rounds": -1}, "num_pruning_rounds"),
        ({"max_power": 0}, "max_power"),
        ({"number_of_gpus": 0}, "number_of_gpus"),
        ({"gpu_model": ""}, "gpu_model"),
        ({"gpu_model": "x" * 301}, "gpu_model"),
        ({"job_id": "other-1"}, "job_id"),  # must start with the prefix
        ({"job_id": ""}, "job_id"),
        ({"job_id": "test-" + "x" * 396}, "job_id"),
        ({"job_id_prefix": ""}, "job_id_prefix"),
        ({"batch_sizes": list(range(1, 1026)), "default_batch_size": 1}, "batch_sizes"),
        ({"max_power": 2e9}, "max_power"),
        ({"mab_prior_precision": 1e31}, "mab_prior_precision"),
        ({"max_epochs": "100"}, "max_epochs"),  # a number in a string is not a number
        ({"higher_is_better_metric": 1}, "higher_is_better_metric"),
    ],
)
def test_register_rejects_bad_config(
    http: httpx.Client, db: Database, overrides: dict[str, Any], field: str
) -> None:
    spec = job_spec(**overrides)
    r = http.post("/jobs", json=spec)
    assert r.status_code == 422, r.text
    assert field in r.json()["message"]
    assert db.query("SELECT count(*) FROM bso_job WHERE job_id = :j", j=spec["job_id"]) == [(0,)]


def test_register_rejects_malformed_and_non_finite_json(http: httpx.Client) -> None:
    r = http.post("/jobs", content=b'{"job_id": ', headers={"content-type": "application/json"})
    assert r.status_code == 422
    body = json.dumps(job_spec()).replace('"target_metric": 0.5', '"target_metric": NaN')
    r = http.post("/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert "target_metric" in r.json()["message"]


def test_delete_job(http: httpx.Client, db: Database) -> None:
    job = register(http)
    trial = predict(http, job["job_id"])
    report(http, trial, 10000)
    r = http.delete("/jobs", params={"job_id": job["job_id"]})
    assert r.status_code == 200
    assert trial_rows(db, job["job_id"]) == []
    r = http.delete("/jobs", params={"job_id": job["job_id"]})
    assert r.status_code == 404
    assert "No job was deleted" in r.json()["message"]
    r = http.get("/jobs/batch_size", params={"job_id": job["job_id"]})
    assert r.status_code == 404


# -- prediction ------------------------------------------------------------------------------


def test_predict_default_then_concurrent(http: httpx.Client, db: Database) -> None:
    job = register(http)
    first = predict(http, job["job_id"])
    assert first == {"job_id": job["job_id"], "batch_size": 1024, "trial_number": 1}
    # The default is still being explored: a concurrent recurrence gets the best-so-far (default).
    second = predict(http, job["job_id"])
    assert second == {"job_id": job["job_id"], "batch_size": 1024, "trial_number": 2}
    assert [r[:4] for r in trial_rows(db, job["job_id"])] == [
        (1, 1024, "Exploration", "Dispatched"),
        (2, 1024, "Concurrent", "Dispatched"),
    ]


def test_predict_unknown_job_and_missing_parameter(http: httpx.Client) -> None:
    r = http.get("/jobs/batch_size", params={"job_id": "test-nope"})
    assert r.status_code == 404
    assert "Unknown job" in r.json()["message"]
    assert r.json()["detail"][0]["loc"] == ["query", "job_id"]
    r = http.get("/jobs/batch_size")
    assert r.status_code == 422
    assert "job_id" in r.json()["message"]
    assert r.json()["detail"][0]["loc"] == ["query", "job_id"]


def test_a_repeated_request_id_gets_the_trial_it_started(http: httpx.Client, db: Database) -> None:
    job = register(http)
    jid = job["job_id"]

    first = predict(http, jid, "req-a")
    assert predict(http, jid, "req-a") == first, "a retry: the same trial"
    second = predict(http, jid, "req-b")
    assert second["trial_number"] == first["trial_number"] + 1
    # After the trial has ended, its request still names it (no new trial).
    report(http, first, 23157, metric=0.55)
    assert predict(http, jid, "req-a") == first
    # Another job may use the same name.
    other = register(http)
    assert predict(http, other["job_id"], "req-a")["trial_number"] == 1
    rows = db.query(
        "SELECT trial_number, request_id FROM bso_trial WHERE job_id = :j ORDER BY trial_number",
        j=jid,
    )
    assert rows == [(1, "req-a"), (2, "req-b")]


@pytest.mark.parametrize("bad", ["", "a" * 65, "has space", "caf\u00e9", "tab\t"])
def test_a_bad_request_id_is_refused_naming_it(http: httpx.Client, db: Database, bad: str) -> None:
    job = register(http)
    r = http.get("/jobs/batch_size", params={"job_id": job["job_id"], "request_id": bad})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["query", "request_id"]
    assert trial_rows(db, job["job_id"]) == [], "nothing started"


def test_concurrent_retries_of_one_request_start_one_trial(
    server: ServerProcess, db: Database
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        job = register(http)
    numbers = predict_at_once(server, job["job_id"], [f"r{k % 4}" for k in range(32)])
    # Four requests, each sent eight times at once: four trials, each request always the same.
    assert sorted(set(numbers)) == [1, 2, 3, 4]
    for k in range(4):
        assert len({numbers[i] for i in range(k, 32, 4)}) == 1
    assert len(trial_rows(db, job["job_id"])) == 4


def test_concurrent_predictions_get_distinct_trial_numbers(
    server: ServerProcess, db: Database
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        job = register(http)
    numbers = sorted(predict_at_once(server, job["job_id"], [None] * 48))
    assert numbers == list(range(1, 49))
    rows = trial_rows(db, job["job_id"])
    assert [r[0] for r in rows] == list(range(1, 49))
    assert sum(1 for r in rows if r[2] == "Exploration") == 1


# -- reporting -------------------------------------------------------------------------------


def test_report_converged_and_over_budget(http: httpx.Client, db: Database) -> None:
    job = register(http)
    jid = job["job_id"]
    t1 = predict(http, jid)
    r = report(http, t1, 23157, metric=0.55)
    assert r == {"stop_train": True, "converged": True, "message": "Train succeeded"}
    t2 = predict(http, jid)
    assert t2["batch_size"] == 512
    # Within budget and not converged: keep going.
    r = report(http, t2, 30000, metric=0.3, epoch=1)
    assert r["stop_train"] is False and r["converged"] is False
    assert r["message"] == "Stop condition not met, keep training"
    # Beyond beta * min_cost = 2 * 23157: early stop, even though the metric converged.
    r = report(http, t2, 48000, metric=0.9, epoch=2)
    assert r["stop_train"] is True and r["converged"] is False
    assert "exceeded the cost upper bound" in r["message"]
    rows = trial_rows(db, jid)
    assert rows[0][3:] == ("Succeeded", True, 1)
    assert rows[1][3:] == ("Succeeded", False, 2)
    # Only the converged trial defines the best cost.
    assert db.query(
        "SELECT min_cost, min_cost_batch_size FROM bso_job WHERE job_id = :j", j=jid
    ) == [(pytest.approx(23157), 1024)]


def test_report_max_epochs_without_beta(http: httpx.Client) -> None:
    job = register(http, beta_knob=None, max_epochs=3)
    trial = predict(http, job["job_id"])
    for epoch in (1, 2):
        assert report(http, trial, 1e9, metric=0.1, epoch=epoch)["stop_train"] is False
    r = report(http, trial, 1e9, metric=0.1, epoch=3)
    assert r["stop_train"] is True and r["converged"] is False
    assert r["message"] == "Train failed to converge within max_epoch(3)"


def test_a_retried_report_counts_once(http: httpx.Client, db: Database) -> None:
    """A client that lost an answer sends the report again: same decision, recorded once."""
    job = register(http, beta_knob=None, max_epochs=3)
    trial = predict(http, job["job_id"])
    first = report(http, trial, 1e9, metric=0.1, epoch=1)
    again = report(http, trial, 2e9, metric=0.2, epoch=1)  # Its data does not matter.
    assert (first["stop_train"], first["converged"]) == (False, False)
    assert (again["stop_train"], again["converged"]) == (False, False)
    assert "already reported" in again["message"]
    assert trial_rows(db, job["job_id"])[0][5] == 1
    report(http, trial, 1e9, metric=0.1, epoch=2)
    assert trial_rows(db, job["job_id"])[0][5] == 2
    # An epoch before the last one recorded is not a retry but a client gone wrong.
    body = dict(trial, time=1.0, energy=1.0, metric=0.1, current_epoch=1)
    r = http.post("/report", json=body)
    assert r.status_code == 409, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "current_epoch"]
    last = report(http, trial, 1e9, metric=0.1, epoch=3)
    assert (last["stop_train"], last["converged"]) == (True, False)
    retried = report(http, trial, 1e9, metric=0.1, epoch=3)
    assert (retried["stop_train"], retried["converged"]) == (True, False)
    rows = db.query(
        "SELECT status, report_count, current_epoch FROM bso_trial WHERE job_id = :j",
        j=job["job_id"],
    )
    assert rows == [("Succeeded", 3, 3)]


def test_report_after_the_end_says_already_reported(http: httpx.Client, db: Database) -> None:
    job = register(http)
    trial = predict(http, job["job_id"])
    first = report(http, trial, 10000)
    assert first == {"stop_train": True, "converged": True, "message": "Train succeeded"}
    assert report(http, trial, 10000) == first  # The same report again: the same answer.
    r = report(http, trial, 10000, epoch=2)
    assert r["stop_train"] is True and r["converged"] is True
    assert r["message"] == "Result for this trial(1) is already reported."
    assert trial_rows(db, job["job_id"])[0][5] == 1  # The duplicates are not recorded.


def test_lower_is_better_metric(http: httpx.Client) -> None:
    job = register(http, higher_is_better_metric=False, target_metric=40.0)
    trial = predict(http, job["job_id"])
    assert report(http, trial, 10000, metric=41.0)["stop_train"] is False
    assert report(http, trial, 10000, metric=39.0, epoch=2)["converged"] is True


def test_min_cost_ignores_non_converged_trials(http: httpx.Client, db: Database) -> None:
    """The reference bug: a cheap failure set the threshold and early-stopped good batch sizes."""
    job = register(http, max_epochs=2)
    jid = job["job_id"]
    t1 = predict(http, jid)
    report(http, t1, 2000, metric=0.1, epoch=1)
    r = report(http, t1, 2000, metric=0.1, epoch=2)
    assert r["converged"] is False
    assert db.query("SELECT min_cost FROM bso_job WHERE job_id = :j", j=jid) == [(None,)]
    t2 = predict(http, jid)
    assert t2["batch_size"] == 2048  # The default failed: pruning turns upwards.
    r = report(http, t2, 8000, metric=0.9)  # 8000 > 2 * 2000, yet no valid bound exists yet.
    assert r == {"stop_train": True, "converged": True, "message": "Train succeeded"}


@pytest.mark.parametrize(
    ("change", "status", "field"),
    [
        ({"trial_number": 99}, 404, "trial_number"),
        ({"job_id": "test-unknown"}, 404, "job_id"),
        ({"batch_size": 100}, 409, "batch_size"),  # not in the job's list
        ({"batch_size": 512}, 409, "batch_size"),  # in the list but not this trial's
        ({"energy": -1.0}, 422, "energy"),
        ({"time": -0.5}, 422, "time"),
        ({"current_epoch": -1}, 422, "current_epoch"),
        ({"trial_number": 0}, 422, "trial_number"),
    ],
)
def test_report_rejects_bad_input_without_side_effects(
    http: httpx.Client, db: Database, change: dict[str, Any], status: int, field: str
) -> None:
    job = register(http)
    trial = predict(http, job["job_id"])
    body = dict(trial, time=1.0, energy=100.0, metric=0.6, current_epoch=1)
    body.update(change)
    r = http.post("/report", json=body)
    assert r.status_code == status, r.text
    assert field in r.json()["message"]
    assert r.json()["detail"][0]["loc"] == ["body", field]
    assert trial_rows(db, job["job_id"]) == [(1, 1024, "Exploration", "Dispatched", None, 0)]
    assert db.query("SELECT min_cost FROM bso_job WHERE job_id = :j", j=job["job_id"]) == [(None,)]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["time", "energy", "metric"])
def test_report_rejects_non_finite_numbers(
    http: httpx.Client, db: Database, field: str, literal: str
) -> None:
    job = register(http)
    trial = predict(http, job["job_id"])
    body = dict(trial, time=1.0, energy=100.0, metric=0.6, current_epoch=1)
    body[field] = "__X__"
    raw = json.dumps(body).replace('"__X__"', literal)
    r = http.post("/report", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert field in r.json()["message"]
    assert trial_rows(db, job["job_id"])[0][3] == "Dispatched"


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b'{"job_id": "test-x", "batch_size": 1',  # truncated
        b"\xff\xfe\xfa",  # not UTF-8
        b"\x80{}",
        b"[" * 50_000,  # nested deeper than the parser's recursion limit
    ],
)
@pytest.mark.parametrize(
    ("method", "url"), [("POST", "/jobs"), ("POST", "/report"), ("PATCH", "/trials")]
)
def test_malformed_bodies_answer_alike_on_every_route(
    http: httpx.Client, method: str, url: str, raw: bytes
) -> None:
    r = http.request(method, url, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body"]  # the body, not a character offset
    assert detail["type"] == "json_invalid"
    assert r.json()["message"].startswith("The body is not JSON")


# Integers the databases cannot store: beyond PostgreSQL's `integer`, beyond SQLite's 64 bits.
TOO_LARGE = [2**31, 2**63, -(2**63) - 1]
JOB_INTEGERS = [
    "default_batch_size",
    "max_epochs",
    "window_size",
    "num_pruning_rounds",
    "mab_num_explorations",
    "number_of_gpus",
]


@pytest.mark.parametrize("value", TOO_LARGE)
@pytest.mark.parametrize("field", [*JOB_INTEGERS, "batch_sizes"])
def test_register_refuses_integers_beyond_storage(
    http: httpx.Client, db: Database, field: str, value: int
) -> None:
    spec = job_spec()
    if field == "batch_sizes":
        spec["batch_sizes"] = [*spec["batch_sizes"], value]
        loc = ["body", "batch_sizes", len(spec["batch_sizes"]) - 1]
    else:
        spec[field] = value
        loc = ["body", field]
    r = http.post("/jobs", json=spec)
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [loc]
    assert db.query("SELECT count(*) FROM bso_job WHERE job_id = :j", j=spec["job_id"]) == [(0,)]


@pytest.mark.parametrize("value", TOO_LARGE)
@pytest.mark.parametrize(
    ("method", "url", "field"),
    [
        ("POST", "/report", "trial_number"),
        ("POST", "/report", "current_epoch"),
        ("POST", "/report", "batch_size"),
        ("PATCH", "/trials", "trial_number"),
        ("PATCH", "/trials", "batch_size"),
    ],
)
def test_trial_integers_beyond_storage(
    http: httpx.Client, db: Database, method: str, url: str, field: str, value: int
) -> None:
    job = register(http)
    trial = predict(http, job["job_id"])
    body = dict(trial, time=1.0, energy=1.0, metric=0.6, current_epoch=1)
    if url == "/trials":
        body = dict(trial)
    body[field] = value
    r = http.request(method, url, json=body)
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [["body", field]]
    assert trial_rows(db, job["job_id"]) == [(1, 1024, "Exploration", "Dispatched", None, 0)]


@pytest.mark.parametrize(
    ("field", "value"),
    [("job_id", "test-a\x00b"), ("job_id_prefix", "te\x00st"), ("gpu_model", "A\x00100")],
)
def test_register_refuses_nul_characters(
    http: httpx.Client, db: Database, field: str, value: str
) -> None:
    spec = job_spec(**{field: value})
    before = db.query("SELECT count(*) FROM bso_job")
    r = http.post("/jobs", json=spec)
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [["body", field]]
    assert db.query("SELECT count(*) FROM bso_job") == before


def test_requests_refuse_nul_characters_in_job_ids(http: httpx.Client) -> None:
    job = register(http)
    trial = predict(http, job["job_id"])
    bad = job["job_id"] + "\x00"
    for method, url in (("GET", "/jobs/batch_size"), ("DELETE", "/jobs")):
        r = http.request(method, url, params={"job_id": bad})
        assert r.status_code == 422, (method, url, r.text)
        assert r.json()["detail"][0]["loc"] == ["query", "job_id"]
    report_body = dict(trial, job_id=bad, time=1.0, energy=1.0, metric=0.6, current_epoch=1)
    for method, url, body in (
        ("POST", "/report", report_body),
        ("PATCH", "/trials", dict(trial, job_id=bad)),
    ):
        r = http.request(method, url, json=body)
        assert r.status_code == 422, (method, url, r.text)
        assert r.json()["detail"][0]["loc"] == ["body", "job_id"]
    assert predict(http, job["job_id"])["trial_number"] == 2  # Nothing else happened.


# -- ending trials ---------------------------------------------------------------------------


def test_end_trial(http: httpx.Client, db: Database) -> None:
    job = register(http)
    jid = job["job_id"]
    t1 = predict(http, jid)
    r = http.patch("/trials", json=t1)
    assert r.status_code == 200
    assert trial_rows(db, jid)[0][3] == "Failed"
    r = report(http, t1, 10000)
    assert r["stop_train"] is True and r["converged"] is False
    assert "already reported" in r["message"]
    # A failed exploration is explored again.
    t2 = predict(http, jid)
    assert (t2["batch_size"], t2["trial_number"]) == (1024, 2)
    report(http, t2, 10000)
    assert http.patch("/trials", json=t2).status_code == 200  # After the report: no change.
    assert trial_rows(db, jid)[1][3] == "Succeeded"
    r = http.patch("/trials", json=dict(t2, trial_number=7))
    assert r.status_code == 404
    r = http.patch("/trials", json=dict(t2, job_id="test-unknown"))
    assert r.status_code == 404


# -- the optimizer through the API -----------------------------------------------------------

# Scripted costs; None = does not converge (reaches max_epochs below the target).
SCRIPT = {1024: 10000, 512: 8000, 256: 9000, 64: None, 2048: 12000, 4096: 30000, 32: 9500}


def run_trial(http: httpx.Client, trial: dict[str, Any], max_epochs: int = 100) -> dict[str, Any]:
    cost = SCRIPT[trial["batch_size"]]
    if cost is None:
        return report(http, trial, 5000, metric=0.1, epoch=max_epochs)
    return report(http, trial, cost)


def test_pruning_then_thompson_sampling(http: httpx.Client, db: Database) -> None:
    job = register(http)
    jid = job["job_id"]
    seq = []
    # Round 1: down from 1024 until 64 fails, then up until 4096 exceeds 2 * 8000.
    # Round 2: over the survivors [256, 512, 1024, 2048] from the cheapest, 512.
    expected = [1024, 512, 256, 64, 2048, 4096, 512, 256, 1024, 2048]
    for i, want in enumerate(expected):
        trial = predict(http, jid)
        assert trial["batch_size"] == want, (i, seq)
        if i in (1, 7):
            # Concurrent recurrence while an exploration is in flight: the best so far.
            concurrent = predict(http, jid)
            assert concurrent["batch_size"] == (1024 if i == 1 else 512)
            run_trial(http, concurrent)
        seq.append(want)
        run_trial(http, trial)
    assert db.query("SELECT stage FROM bso_job WHERE job_id = :j", j=jid) == [("Pruning",)]
    # Deterministic costs give zero-variance arms: Thompson sampling always takes the cheapest.
    for _ in range(50):
        trial = predict(http, jid)
        assert trial["batch_size"] == 512
        run_trial(http, trial)
    arms = db.query("SELECT batch_size FROM bso_arm WHERE job_id = :j ORDER BY batch_size", j=jid)
    assert [a[0] for a in arms] == [256, 512, 1024, 2048]
    assert db.query("SELECT stage FROM bso_job WHERE job_id = :j", j=jid) == [("MAB",)]
    rows = trial_rows(db, jid)
    assert len(rows) == 12 + 50
    assert all(r[3] == "Succeeded" for r in rows)


def test_thompson_sampling_explores_noisy_arms(http: httpx.Client, db: Database) -> None:
    job = register(http, num_pruning_rounds=1, batch_sizes=[256, 512, 1024], window_size=0)
    jid = job["job_id"]
    for want in (1024, 512, 256):
        trial = predict(http, jid)
        assert trial["batch_size"] == want
        report(http, trial, {1024: 10000, 512: 9000, 256: 9500}[want])
    # One observation per arm < mab_num_explorations (2): each arm is explored once more.
    explored = []
    for _ in range(3):
        trial = predict(http, jid)
        explored.append(trial["batch_size"])
        report(http, trial, {1024: 11000, 512: 8000, 256: 9900}[trial["batch_size"]])
    assert sorted(explored) == [256, 512, 1024]
    obs = db.query("SELECT num_observations FROM bso_arm WHERE job_id = :j", j=jid)
    assert sorted(o[0] for o in obs) == [2, 2, 2]
    picks = [predict(http, jid)["batch_size"] for _ in range(40)]
    assert set(picks) <= {256, 512, 1024}
    assert picks.count(512) > 20  # Clearly the cheapest arm.


def test_pruning_with_no_survivor_is_a_conflict(http: httpx.Client) -> None:
    job = register(http, max_epochs=1)
    jid = job["job_id"]
    while True:
        r = http.get("/jobs/batch_size", params={"job_id": jid})
        if r.status_code != 200:
            break
        report(http, r.json(), 10000, metric=0.0, epoch=1)
    assert r.status_code == 409
    assert "No batch size converged" in r.json()["message"]


# -- authentication --------------------------------------------------------------------------


@pytest.mark.parametrize("database", BACKENDS, indirect=True)
def test_bearer_token_required_when_configured(database: Database) -> None:
    if database.backend == "postgres":
        database.migrate()
    srv = ServerProcess(database.url, env={"ZEUS_BSO_TOKEN": "t0ken"}).start()
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            spec = job_spec()
            trial = {"job_id": spec["job_id"], "batch_size": 1024, "trial_number": 1}
            report_body = dict(trial, time=1.0, energy=1.0, metric=0.6, current_epoch=1)
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "t0ken"},
                {"Authorization": "Basic t0ken"},
                {"Authorization": "Bearer t0ken2"},
            ):
                for method, url, kwargs in (
                    ("POST", "/jobs", {"json": spec}),
                    ("GET", "/jobs/batch_size", {"params": {"job_id": spec["job_id"]}}),
                    ("POST", "/report", {"json": report_body}),
                    ("PATCH", "/trials", {"json": trial}),
                    ("DELETE", "/jobs", {"params": {"job_id": spec["job_id"]}}),
                    # The documentation and unknown paths too: nothing answers without it.
                    ("GET", "/openapi.json", {}),
                    ("GET", "/docs", {}),
                    ("GET", "/redoc", {}),
                    ("GET", "/nowhere", {}),
                ):
                    r = http.request(method, url, headers=headers, **kwargs)
                    assert r.status_code == 401, (method, url, headers)
                    assert r.headers["www-authenticate"] == "Bearer"
                    assert r.json()["detail"][0]["loc"] == ["header", "authorization"]
            assert database.query("SELECT count(*) FROM bso_job") == [(0,)]
            # The scheme is case-insensitive (RFC 7235).
            ok, lower, upper = (
                {"Authorization": f"{s} t0ken"} for s in ("Bearer", "bearer", "BEARER")
            )
            assert http.post("/jobs", json=spec, headers=lower).status_code == 201
            r = http.get("/jobs/batch_size", params={"job_id": spec["job_id"]}, headers=upper)
            assert r.status_code == 200
            assert r.json() == trial
            r = http.post("/report", json=report_body, headers=ok)
            assert r.status_code == 200, r.text
            assert http.get("/openapi.json", headers=ok).status_code == 200
    finally:
        srv.stop()


def test_reference_serve_command(database: Database) -> None:
    """`uvicorn zeus.optimizer.batch_size.server.router:app`, configured by environment."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "zeus.optimizer.batch_size.server.router:app"]
    srv = ServerProcess(
        database.url,
        port=port,
        env={"ZEUS_BSO_DATABASE_URL": database.url},
        cmd=[*cmd, "--host", "127.0.0.1", "--port", str(port)],
    ).start()
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            job = register(http)
            assert predict(http, job["job_id"])["batch_size"] == 1024
    finally:
        srv.stop()
