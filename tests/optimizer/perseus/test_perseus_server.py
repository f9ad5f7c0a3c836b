"""The Perseus server over HTTP: every endpoint, every refusal, rounds, dumps, idle cleanup."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from zeus.optimizer.perseus.common import (
    REGISTER_JOB_URL,
    PerseusSettings,
    load_prof,
    load_ranks,
    load_sched,
)
from zeus.optimizer.perseus.server.router import create_app

FREQS = [1740, 1500, 1200, 900]


def job(pp: int = 2, **kw) -> dict:
    return dict(pp_degree=pp, dp_degree=1, tp_degree=1, world_size=pp, **kw)


def rank(r: int, freqs=FREQS) -> dict:
    return dict(rank=r, dp_rank=0, pp_rank=r, tp_rank=0, available_frequencies=freqs)


def make_client(tmp_path: Path, scheduler: str, **kw) -> TestClient:
    settings = PerseusSettings(
        scheduler=scheduler,
        scheduler_args=kw.pop("scheduler_args", {"num_microbatches": 2}),
        dump_dir=str(tmp_path / "dump"),
        **kw,
    )
    return TestClient(create_app(settings))


def register(c: TestClient, pp: int = 2, **kw) -> str:
    r = c.post("/register_job", json=job(pp, **kw))
    assert r.status_code == 200, r.text
    jid = r.json()
    for i in range(pp):
        r = c.post(f"/register_rank/{jid}", json=rank(i))
        assert r.status_code == 200, r.text
    return jid


def get_all(c: TestClient, jid: str, ranks: range) -> dict[int, httpx.Response]:
    """Ask for every rank's schedule at once, from threads (each request blocks)."""
    out: dict[int, httpx.Response] = {}

    def get(r: int) -> None:
        out[r] = c.get(f"/schedule/{jid}", params={"rank": r})

    threads = [threading.Thread(target=get, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(out) == len(ranks)
    return out


def result(r: int, t: float = 1.0, e: float = 10.0) -> dict:
    return dict(
        rank=r,
        iter_time=[t],
        iter_energy=[e],
        time_breakdown={"forward": [[t / 3, t / 3]], "backward": [[t / 3, t / 3]]},
        energy_breakdown={"forward": [[e / 3, e / 3]], "backward": [[e / 3, e / 3]]},
    )


def test_register_job_returns_generated_id_and_validates(tmp_path):
    with make_client(tmp_path, "AllMaxFrequency") as c:
        r = c.post("/register_job", json=job(2, job_metadata="llama"))
        assert r.status_code == 200
        jid = r.json()
        assert jid.endswith("+dp1+pp2+tp1+AllMaxFrequency+llama")
        # A second identical job in the same second still gets its own id.
        assert c.post("/register_job", json=job(2, job_metadata="llama")).json() != jid
        bad = c.post("/register_job", json=dict(job(2), world_size=3))
        assert bad.status_code == 422 and "world_size" in bad.text
        # Metadata names the dump directory: too long, or not path-safe, is refused.
        for metadata in ("x" * 300, "../etc", "a/b", "", "run 1"):
            bad = c.post("/register_job", json=job(2, job_metadata=metadata))
            assert bad.status_code == 422 and "job_metadata" in bad.text, metadata
        ok = c.post("/register_job", json=job(2, job_metadata="run-42.v2_a=b")).json()
        assert ok.endswith("+run-42.v2_a=b")
        assert c.post("/register_job", json=dict(job(2), job_id="mine")).status_code == 422
        assert c.post("/register_job", json=dict(job(2), pp_degree=0)).status_code == 422


def test_register_rank_errors(tmp_path):
    with make_client(tmp_path, "AllMaxFrequency") as c:
        assert c.post("/register_rank/nope", json=rank(0)).status_code == 404
        jid = c.post("/register_job", json=job(2)).json()
        r = c.post(f"/register_rank/{jid}", json=rank(2))
        assert r.status_code == 400 and "out of range" in r.text
        assert c.post(f"/register_rank/{jid}", json=dict(rank(1), pp_rank=5)).status_code == 400
        assert c.post(f"/register_rank/{jid}", json=rank(0)).status_code == 200
        dup = c.post(f"/register_rank/{jid}", json=rank(0))
        assert dup.status_code == 409 and "already registered" in dup.text
        assert c.post(f"/register_rank/{jid}", json=dict(rank(1), rank=-1)).status_code == 422


def test_schedule_waits_for_every_rank(tmp_path):
    with make_client(tmp_path, "AllMaxFrequency") as c:
        jid = register(c)
        done = threading.Event()
        got: dict = {}

        def ask0() -> None:
            got[0] = c.get(f"/schedule/{jid}", params={"rank": 0})
            done.set()

        t = threading.Thread(target=ask0)
        t.start()
        # Rank 0 is held until rank 1 asks too.
        assert not done.wait(0.5)
        r1 = c.get(f"/schedule/{jid}", params={"rank": 1})
        assert done.wait(10)
        t.join()
        s0, s1 = got[0].json(), r1.json()
        assert s0 == {
            "rank": 0,
            "frequencies": [["forward", 1740], ["forward", 1740], ["backward", 1740]]
            + [["backward", 1740]],
        }
        assert [f[0] for f in s1["frequencies"]] == ["forward", "backward"] * 2
        assert load_ranks(str(tmp_path / "dump" / jid))[1].pp_rank == 1


def test_schedule_errors(tmp_path):
    with make_client(tmp_path, "AllMaxFrequency") as c:
        assert c.get("/schedule/nope", params={"rank": 0}).status_code == 404
        jid = c.post("/register_job", json=job(2)).json()
        assert c.get(f"/schedule/{jid}", params={"rank": 7}).status_code == 400
        r = c.get(f"/schedule/{jid}", params={"rank": 0})
        assert r.status_code == 400 and "not registered" in r.text


def test_results_rounds_and_dumps_with_profiler(tmp_path):
    args = {"num_microbatches": 2, "frequencies": [1740, 900], "warmup_iters": 0}
    with make_client(tmp_path, "InstructionProfiler", scheduler_args=args) as c:
        assert c.post("/result/nope", json=result(0)).status_code == 404
        jid = register(c)
        early = c.post(f"/result/{jid}", json=result(0))
        assert early.status_code == 400 and "before receiving" in early.text
        seen = []
        for n, (t, e) in enumerate([(1.0, 30.0), (2.0, 12.0)]):
            scheds = get_all(c, jid, range(2))
            seen.append({s.json()["frequencies"][0][1] for s in scheds.values()})
            for r in range(2):
                assert c.post(f"/result/{jid}", json=result(r, t, e)).status_code == 200
            if n == 0:
                dup = c.post(f"/result/{jid}", json=result(0))
                assert dup.status_code == 409
        assert seen == [{1740}, {900}]
        # After profiling: everything at the highest frequency, and the profile is on disk.
        final = get_all(c, jid, range(2))
        assert {f for _, f in final[0].json()["frequencies"]} == {1740}
        dump = tmp_path / "dump" / jid
        assert load_prof(str(dump), 1)[0].iter_time == [2.0]
        assert load_sched(str(dump), 0)[1].frequencies[0] == ("forward", 1740)
        rows = (dump / "instruction_profile.csv").read_text().splitlines()
        assert rows[0] == "rank,dp_rank,pp_rank,tp_rank,stage,instruction,frequency,time,energy"
        assert "0,0,0,0,0,forward,900,0.6666666666666666,4.0" in rows


def test_a_retried_schedule_request_gets_the_same_round(tmp_path):
    """A client retrying after a lost answer must not move its rank to the next round."""
    args = {"num_microbatches": 2, "frequencies": [1740, 900], "warmup_iters": 0}
    with make_client(tmp_path, "InstructionProfiler", scheduler_args=args) as c:
        jid = register(c)
        first = get_all(c, jid, range(2))
        # Rank 0 asks again (its answer was lost): round 0 again, at once.
        again = c.get(f"/schedule/{jid}", params={"rank": 0})
        assert again.status_code == 200 and again.json() == first[0].json()
        assert again.json()["frequencies"][0][1] == 1740
        for r in range(2):
            assert c.post(f"/result/{jid}", json=result(r, 1.0, 30.0)).status_code == 200
        # A retried report counts once.
        assert c.post(f"/result/{jid}", json=result(1, 1.0, 30.0)).status_code == 409
        second = get_all(c, jid, range(2))
        assert {s.json()["frequencies"][0][1] for s in second.values()} == {900}


def test_scheduler_value_error_is_400_for_every_rank(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([[["forward", 1740], ["backward", 1740]]]))  # one rank only
    with make_client(tmp_path, "PointSolution", scheduler_args={"solution_path": str(plan)}) as c:
        jid = register(c)
        for resp in get_all(c, jid, range(2)).values():
            assert resp.status_code == 400
            assert "has plans for 1 ranks" in resp.json()["detail"]
            # One line, no traceback: the server's install paths stay in its log.
            assert "Traceback" not in resp.text and ".py" not in resp.json()["detail"]


def test_point_solution_replays_json_plan(tmp_path):
    plan = [[["forward", 1200], ["backward", 900]], [["forward", 1500], ["backward", 1740]]]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with make_client(tmp_path, "PointSolution", scheduler_args={"solution_path": str(path)}) as c:
        jid = register(c)
        for _ in range(2):
            got = get_all(c, jid, range(2))
            assert [got[r].json()["frequencies"] for r in range(2)] == plan
            for r in range(2):
                c.post(f"/result/{jid}", json=result(r))


def test_job_lookup_by_metadata(tmp_path):
    with make_client(tmp_path, "AllMaxFrequency") as c:
        assert c.get("/job_id", params={"job_metadata": "x"}).status_code == 404
        c.post("/register_job", json=job(2, job_metadata="x"))
        newer = c.post("/register_job", json=job(2, job_metadata="x")).json()
        assert c.get("/job_id", params={"job_metadata": "x"}).json() == newer


def test_idle_jobs_are_dropped(tmp_path):
    with make_client(
        tmp_path, "AllMaxFrequency", max_job_idle_time=0.3, cleanup_interval=0.05
    ) as c:
        idle = c.post("/register_job", json=job(2)).json()
        busy = c.post("/register_job", json=job(2)).json()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            # Talking to a job keeps it alive.
            assert c.post(f"/register_rank/{busy}", json=rank(0)).status_code in (200, 409)
            time.sleep(0.05)
        assert c.post(f"/register_rank/{idle}", json=rank(0)).status_code == 404
        assert c.post(f"/register_rank/{busy}", json=rank(1)).status_code == 200


def test_settings_from_environment(monkeypatch):
    from zeus.optimizer.perseus.server.scheduler import AllMaxFrequency

    monkeypatch.setenv("PERSEUS_SCHEDULER", "AllMaxFrequency")
    monkeypatch.setenv("PERSEUS_SCHEDULER_ARGS", '{"num_microbatches": 4}')
    monkeypatch.setenv("PERSEUS_LOG_LEVEL", "info")
    monkeypatch.setenv("PERSEUS_MAX_JOB_IDLE_TIME", "12")
    s = PerseusSettings()
    assert s.scheduler is AllMaxFrequency
    assert s.scheduler_args == {"num_microbatches": 4}
    assert s.log_level == "INFO" and s.max_job_idle_time == 12
    monkeypatch.setenv("PERSEUS_SCHEDULER_ARGS", '{"num_microbatch": 4}')
    with pytest.raises(ValueError, match="Invalid scheduler args"):
        PerseusSettings()
    monkeypatch.setenv("PERSEUS_SCHEDULER", "NoSuchScheduler")
    with pytest.raises(ValueError, match="Unknown scheduler 'NoSuchScheduler'"):
        PerseusSettings()


def start_server(tmp_path: Path) -> tuple[subprocess.Popen, str, str]:
    """Run the console script on a free loopback port; returns the process, its base URL and
    the id of a 2-rank job registered once it answers."""
    import os

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PERSEUS_LOG_LEVEL": "WARNING",
        "PERSEUS_DUMP_DIR": str(tmp_path),
        "PERSEUS_SCHEDULER_ARGS": '{"num_microbatches": 1}',
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "zeus.optimizer.perseus.server.cli", "--port", str(port)],
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            r = httpx.post(f"{base}/register_job", json=job(2))
            break
        except httpx.ConnectError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)
    assert r.status_code == 200, r.text
    return proc, base, r.json()


def test_console_entry_serves_on_loopback(tmp_path):
    proc, _, jid = start_server(tmp_path)
    try:
        assert "AllMaxFrequency" in jid  # the default scheduler
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_sigterm_with_a_pending_schedule_request_answers_503_and_exits(tmp_path):
    """Rank 0 waits for rank 1, which never asks: SIGTERM still ends the server at once."""
    import signal

    proc, base, jid = start_server(tmp_path)
    try:
        for r in range(2):
            assert httpx.post(f"{base}/register_rank/{jid}", json=rank(r)).status_code == 200
        pending: dict[str, httpx.Response] = {}
        waiter = threading.Thread(
            target=lambda: pending.setdefault(
                "r", httpx.get(f"{base}/schedule/{jid}", params={"rank": 0}, timeout=30)
            )
        )
        waiter.start()
        time.sleep(0.5)
        assert not pending, "rank 0 waits for rank 1"
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        took = time.monotonic() - t
        waiter.join(timeout=10)
        assert pending["r"].status_code == 503 and "shutting down" in pending["r"].text
        assert took < 5, f"exited {took:.1f} s after SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bodies_over_the_limit_are_refused_unread(tmp_path):
    """A body past `MAX_BODY_BYTES` is 413, declared (Content-Length) or streamed (chunked)."""
    from zeus.optimizer.perseus.server import router

    big = b"[" + b"0," * (router.MAX_BODY_BYTES // 2) + b"0]"
    with make_client(tmp_path, "AllMaxFrequency") as c:
        r = c.post(REGISTER_JOB_URL, content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        assert str(router.MAX_BODY_BYTES) in r.json()["detail"]

        def chunks():
            for k in range(0, len(big), 1 << 20):
                yield big[k : k + (1 << 20)]

        r = c.post(REGISTER_JOB_URL, content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        # Bodies under the limit work as before.
        assert c.post(REGISTER_JOB_URL, json=job()).status_code == 200
