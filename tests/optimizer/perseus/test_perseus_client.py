"""PerseusOptimizer against a live server (uvicorn in a thread), without torch."""

from __future__ import annotations

import socket
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn")

from zeus.optimizer.perseus import PerseusOptimizer  # noqa: E402
from zeus.optimizer.perseus.common import PerseusSettings  # noqa: E402
from zeus.optimizer.perseus.server.router import create_app  # noqa: E402


@pytest.fixture
def server(tmp_path):
    """Start a server with the given scheduler; yields a factory returning its URL."""
    servers = []

    def start(scheduler: str, **args) -> str:
        settings = PerseusSettings(
            scheduler=scheduler,
            scheduler_args=args,
            dump_dir=str(tmp_path / "dump"),
            log_level="WARNING",
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        srv = uvicorn.Server(
            uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="error")
        )
        thread = threading.Thread(target=srv.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not srv.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        servers.append((srv, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for srv, thread in servers:
        srv.should_exit = True
        thread.join(timeout=10)


def make(url: str, rank: int = 0, pp: int = 1, **kw) -> PerseusOptimizer:
    return PerseusOptimizer(
        rank=rank,
        dp_rank=0,
        pp_rank=rank,
        tp_rank=0,
        device_id=rank,
        dp_degree=1,
        pp_degree=pp,
        tp_degree=1,
        world_size=pp,
        server_url=url,
        wait_for_frequency=True,
        **kw,
    )


def test_runs_plan_reports_and_enforces_order(server, sim_gpus):
    import zeus.device.sim

    sim_gpus("A40")
    url = server("AllMaxFrequency", num_microbatches=2)
    opt = make(url, blocking_power=30.0)
    try:
        assert opt.device_id == 0  # the reference never set it
        assert opt.schedule == [("forward", 1740), ("backward", 1740)] * 2
        opt.on_step_begin()
        for name, _ in opt.schedule:
            opt.on_instruction_begin(name)
            zeus.device.sim.run(1.0 if name == "forward" else 2.0, [0])
            opt.on_instruction_end(name)
        opt.on_step_end()
        res = opt.last_result
        assert res.time_breakdown["forward"][0] == pytest.approx([1.0, 1.0])
        assert res.time_breakdown["backward"][0] == pytest.approx([2.0, 2.0])
        assert res.iter_time[0] == pytest.approx(6.0)
        assert res.iter_energy[0] == pytest.approx(6 * 202.5, rel=0.01)
        assert res.blocking_power == 30.0

        with pytest.raises(RuntimeError, match="expects 'forward'"):
            opt.on_instruction_begin("backward")
        opt.on_instruction_begin("forward")
        opt.on_instruction_end("forward")
        with pytest.raises(RuntimeError, match="were not run"):
            opt.on_step_end()
        for name in ["backward", "forward", "backward"]:
            opt.on_instruction_begin(name)
            opt.on_instruction_end(name)
        with pytest.raises(RuntimeError, match="fewer frequencies than expected"):
            opt.on_instruction_begin("forward")
    finally:
        opt.close()
    # Clocks are back to default after close().
    assert zeus.device.sim.steady_state(0)[0] == pytest.approx(1.0)


def test_two_ranks_find_the_job_by_metadata_or_id(server, sim_gpus):
    sim_gpus("A40,A40")
    url = server("AllMaxFrequency", num_microbatches=1)
    opts: dict[int, PerseusOptimizer] = {}

    def start(rank: int, **kw) -> None:
        opts[rank] = make(url, rank, pp=2, **kw)

    t = threading.Thread(target=start, args=(1,), kwargs={"job_metadata": "run-42"})
    t.start()
    start(0, job_metadata="run-42")
    t.join(timeout=30)
    try:
        assert opts[0].job_id == opts[1].job_id
        assert opts[0].job_id.endswith("+run-42")
        assert opts[1].schedule == [("forward", 1740), ("backward", 1740)]
    finally:
        for o in opts.values():
            o.close()

    with pytest.raises(ValueError, match="job_metadata"):
        make(url, 1, pp=2)


def test_server_refusal_is_runtime_error(server, sim_gpus):
    sim_gpus("A40")
    url = server("AllMaxFrequency", num_microbatches=1)
    with pytest.raises(RuntimeError, match="404"):
        make(url, job_id="no-such-job")
