"""Batch size optimizer server load benchmark (SQLite and PostgreSQL).

Starts `python -m zeus.optimizer.batch_size.server` on a fresh database and runs the shared load
generator (`bso_load.py BASE_URL CLIENTS CYCLES`, which speaks the reference REST API) at 1 and
32 clients. Besides its output, prints the CPU time per cycle of the server and of the load
generator (one Python process using httpx, which on a small machine costs more CPU per cycle
than the server and then bounds the throughput).

Usage:
    python benchmarks/bso_bench.py [--load .../bso_load.py] [--backends sqlite,postgres]
        [--cycles1 300] [--cycles32 20] [--workers 1]

PostgreSQL: uses $ZEUS_BSO_TEST_POSTGRES_URL, else starts one with `.ci/postgres.sh`.
Targets (issue 7): 32 clients >= 4x the reference's 52-60 cycles/s with p99 < 250 ms;
1 client p50 < 3 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOAD = Path("/work/shared/bench/bso_load.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def children_cpu(pid: int) -> float:
    """CPU seconds of `pid` and its direct children (uvicorn workers)."""
    total = cpu_seconds(pid)
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            total += cpu_seconds(int(child))
        except FileNotFoundError:
            pass
    return total


async def pg_admin(url: str, sql: str) -> None:
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text(sql))
    finally:
        await engine.dispose()


def postgres_url() -> str:
    url = os.environ.get("ZEUS_BSO_TEST_POSTGRES_URL")
    if not url:
        url = subprocess.run(
            [str(ROOT / ".ci" / "postgres.sh")], check=True, capture_output=True, text=True
        ).stdout.strip()
    name = f"bso_bench_{uuid.uuid4().hex[:8]}"
    asyncio.run(pg_admin(url, f'CREATE DATABASE "{name}"'))
    return url.rsplit("/", 1)[0] + "/" + name


def run_backend(backend: str, args: argparse.Namespace, tmp: Path) -> None:
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp / 'bench.db'}"
    else:
        url = postgres_url()
        subprocess.run(
            [sys.executable, "-m", "zeus.optimizer.batch_size.server", "migrate"],
            env={**os.environ, "ZEUS_BSO_DATABASE_URL": url},
            check=True,
            capture_output=True,
        )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp / f"server-{backend}.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zeus.optimizer.batch_size.server",
            "--port",
            str(port),
            "--database-url",
            url,
            "--workers",
            str(args.workers),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(600):
            try:
                httpx.get(f"{base}/openapi.json", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"server did not start; see {log.name}")
        for clients, cycles in ((1, args.cycles1), (32, args.cycles32)):
            before = children_cpu(server.pid)
            gen_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run(
                [sys.executable, str(args.load), base, str(clients), str(cycles)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            used = children_cpu(server.pid) - before
            gen_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            gen = (gen_after.ru_utime - gen_before.ru_utime) + (
                gen_after.ru_stime - gen_before.ru_stime
            )
            n = clients * cycles
            print(
                f"[{backend}] {out} | cpu per cycle: server {1e3 * used / n:.2f} ms, "
                f"load generator {1e3 * gen / n:.2f} ms",
                flush=True,
            )
        if args.split > 1:
            # The same 32 clients spread over several generator processes: shows what the
            # server sustains when one Python generator process is no longer the bottleneck.
            per = 32 // args.split
            procs = [
                subprocess.Popen(
                    [sys.executable, str(args.load), base, str(per), str(args.cycles32)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(args.split)
            ]
            outs = [p.communicate()[0].strip() for p in procs]
            total = sum(float(o.split("throughput=")[1].split()[0]) for o in outs)
            p99 = max(float(o.split("p99=")[1].split("ms")[0]) for o in outs)
            print(
                f"[{backend}] {args.split} generators x {per} clients: "
                f"throughput={total:.1f} cycles/s, worst p99={p99:.1f}ms",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
        if backend == "postgres":
            admin = url.rsplit("/", 1)[0] + "/postgres"
            name = url.rsplit("/", 1)[1]
            asyncio.run(pg_admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", type=Path, default=DEFAULT_LOAD)
    p.add_argument("--backends", default="sqlite,postgres")
    p.add_argument("--cycles1", type=int, default=300)
    p.add_argument("--cycles32", type=int, default=20)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--split", type=int, default=2, help="also run 32 clients over N generators")
    args = p.parse_args()
    if not args.load.is_file():
        raise SystemExit(f"load generator {args.load} not found")
    with tempfile.TemporaryDirectory(prefix="bso-bench-") as tmp:
        for backend in args.backends.split(","):
            run_backend(backend, args, Path(tmp))


if __name__ == "__main__":
    main()
