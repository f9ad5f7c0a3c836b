"""End-to-end Perseus on simulated GPUs: a 4-stage, 8-microbatch 1F1B pipeline.

One Perseus server and one process per pipeline stage, each with its own simulated A40
(`ZEUS_GPU_BACKEND=sim`, `ZEUS_SIM_CLOCK=virtual`). Every stage runs the real client
(`PerseusOptimizer`): before each instruction the `FrequencyController` locks the clock the
server planned, then the instruction is "run" with `zeus.device.sim.run(work, [0])`, whose time and
energy come from the simulated GPU's model at that clock. Forward passes are about one unit of
work and backward passes two, scaled per stage so the stages differ.

How iteration time and energy are measured: the four processes have separate virtual clocks,
so they cannot wait for each other in simulated time. Each process measures every
instruction's duration and energy (backend clock and energy counter) and its GPU's idle power;
the pipeline's iteration time is then the longest path of the 1F1B DAG with those durations,
and the iteration energy is the instructions' energy plus each GPU's idle power times the time
it waits (`T - busy_s`). Running the stages as threads on one shared virtual clock would
serialise them instead (every `run` advances the one clock), so it would not model overlap.

Usage:
    python examples/perseus/run_pipeline.py                   # AllMaxFrequency vs EnergyOptimal
    python examples/perseus/run_pipeline.py --json out.json   # also write the summary

Needs the `perseus` extra (fastapi, uvicorn, httpx, pydantic-settings).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

NUM_STAGES = 4
NUM_MICROBATCHES = 8
# Units of simulated work per instruction: forward ~1, backward ~2, stage 2 the heaviest.
FORWARD_WORK = [0.9, 1.0, 1.2, 0.8]
BACKWARD_WORK = [2.0 * w for w in FORWARD_WORK]


def worker(args: argparse.Namespace) -> None:
    """One pipeline stage: run `args.iters` iterations under the server's plan."""
    import zeus.device.sim
    from zeus.device import get_gpus
    from zeus.optimizer.perseus import PerseusOptimizer

    gpus = get_gpus()
    rank = args.rank
    # Idle ("blocking") power, measured: let the virtual clock run with the GPU idle.
    e0 = gpus.get_total_energy_consumption(0)
    zeus.device.sim.advance(10.0)
    blocking_power = (gpus.get_total_energy_consumption(0) - e0) / 1000.0 / 10.0

    opt = PerseusOptimizer(
        rank=rank,
        dp_rank=0,
        pp_rank=rank,
        tp_rank=0,
        device_id=0,
        dp_degree=1,
        pp_degree=NUM_STAGES,
        tp_degree=1,
        world_size=NUM_STAGES,
        server_url=args.server_url,
        job_metadata=args.run_tag,
        blocking_power=blocking_power,
        wait_for_frequency=True,
    )
    work = {"forward": FORWARD_WORK[rank], "backward": BACKWARD_WORK[rank]}
    iterations = []
    try:
        for _ in range(args.iters):
            plan = opt.schedule
            opt.on_step_begin()
            record = []
            for name, freq in plan:
                opt.on_instruction_begin(name)
                t0, en0 = gpus.now(), gpus.get_total_energy_consumption(0)
                zeus.device.sim.run(work[name], [0])
                t1, en1 = gpus.now(), gpus.get_total_energy_consumption(0)
                opt.on_instruction_end(name)
                record.append([name, freq, t1 - t0, (en1 - en0) / 1000.0])
            opt.on_step_end()
            iterations.append(record)
    finally:
        opt.close()
    Path(args.out).write_text(
        json.dumps({"rank": rank, "blocking_power": blocking_power, "iterations": iterations})
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Perseus server exited with {proc.returncode}")
        try:
            httpx.get(f"{url}/docs", timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("the Perseus server did not start")


def run_job(scheduler: str, scheduler_args: dict, iters: int, workdir: Path) -> dict:
    """Run the server and the four stages; return per-iteration measured time and energy."""
    from zeus.optimizer.perseus.frontier import iteration_time

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    env.update(
        PERSEUS_SCHEDULER=scheduler,
        PERSEUS_SCHEDULER_ARGS=json.dumps(scheduler_args),
        PERSEUS_DUMP_DIR=str(workdir / "dump"),
        PERSEUS_LOG_LEVEL="WARNING",
        ZEUS_LOG_LEVEL="WARNING",
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "zeus.optimizer.perseus.server.cli", "--port", str(port)],
        env=env,
    )
    try:
        _wait_for_server(url, server)
        tag = f"{scheduler}-{uuid.uuid4().hex[:8]}"
        wenv = dict(env, ZEUS_GPU_BACKEND="sim", ZEUS_SIM_CLOCK="virtual", ZEUS_SIM_GPUS="A40")
        # Each stage's simulated A40 is its own device, but all four have GPU 0's identity: in
        # one journal directory they would take each other for processes sharing one GPU.
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    "--rank",
                    str(r),
                    "--iters",
                    str(iters),
                    "--server-url",
                    url,
                    "--run-tag",
                    tag,
                    "--out",
                    str(workdir / f"{scheduler}-rank{r}.json"),
                ],
                env=dict(wenv, ZEUS_STATE_DIR=str(workdir / f"state-rank{r}")),
            )
            for r in range(NUM_STAGES)
        ]
        for w in workers:
            if w.wait(timeout=600) != 0:
                raise RuntimeError(f"a pipeline stage exited with {w.returncode}")
    finally:
        server.terminate()
        server.wait(timeout=30)

    ranks = [
        json.loads((workdir / f"{scheduler}-rank{r}.json").read_text()) for r in range(NUM_STAGES)
    ]
    out = []
    for it in range(iters):
        stages = [ranks[r]["iterations"][it] for r in range(NUM_STAGES)]
        t = iteration_time(NUM_MICROBATCHES, [[x[2] for x in s] for s in stages])
        busy = [sum(x[2] for x in s) for s in stages]
        energy = sum(x[3] for s in stages for x in s) + sum(
            ranks[r]["blocking_power"] * (t - busy[r]) for r in range(NUM_STAGES)
        )
        freqs = [sorted({x[1] for x in s}) for s in stages]
        out.append({"time": t, "energy": energy, "frequencies": freqs})
    return {"scheduler": scheduler, "iterations": out}


def main(argv: list[str] | None = None) -> dict:
    """Run AllMaxFrequency and EnergyOptimal and compare their last iterations."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--server-url", help=argparse.SUPPRESS)
    p.add_argument("--run-tag", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--iters", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--num-frequencies", type=int, default=10, help="frequencies to profile")
    p.add_argument("--slowdown", type=float, default=0.0, help="allowed slowdown (fraction)")
    p.add_argument("--json", help="write the summary here")
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return {}

    with tempfile.TemporaryDirectory(prefix="perseus-e2e-") as tmp:
        workdir = Path(tmp)
        base = run_job("AllMaxFrequency", {"num_microbatches": NUM_MICROBATCHES}, 2, workdir)
        opt_args = {
            "num_microbatches": NUM_MICROBATCHES,
            "num_frequencies": args.num_frequencies,
            "warmup_iters": 0,
            "profile_iters": 1,
            "slowdown": args.slowdown,
        }
        # One profiling iteration per frequency, then the optimised plan twice.
        optimal = run_job("EnergyOptimal", opt_args, args.num_frequencies + 2, workdir)
    b, o = base["iterations"][-1], optimal["iterations"][-1]
    summary = {
        "all_max": b,
        "optimal": o,
        "profiling": optimal["iterations"][: args.num_frequencies],
        "time_ratio": o["time"] / b["time"],
        "energy_ratio": o["energy"] / b["energy"],
    }
    print(f"AllMaxFrequency: {b['time']:.3f} s, {b['energy']:.1f} J per iteration")
    print(f"EnergyOptimal:   {o['time']:.3f} s, {o['energy']:.1f} J per iteration")
    print(
        f"time x{summary['time_ratio']:.4f} ({(summary['time_ratio'] - 1) * 100:+.2f} %), "
        f"energy x{summary['energy_ratio']:.4f} "
        f"({(summary['energy_ratio'] - 1) * 100:+.2f} %)"
    )
    print("frequencies per stage (optimal):", o["frequencies"])
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
