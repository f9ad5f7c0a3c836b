"""Batch size optimizer server load benchmark (SQLite and PostgreSQL).

Starts `python -m zeus.optimizer.batch_size.server` on a fresh database and runs the shared load
generator (`bso_load.py BASE_URL CLIENTS CYCLES`, which speaks the reference REST API) at 1 and
32 clients. Besides its output, prints the CPU time per cycle of the server and of the load
generator: one Python process using httpx, which on a small machine costs more CPU per cycle
than the server and then bounds what can be measured.

Two more measurements put the figures in context, since this machine's speed varies:
- `--floor`: the same generator against servers that do no work (a canned answer per
  endpoint): on bare asyncio streams, once with kept-alive connections and once closing them,
  and as a trivial ASGI app under uvicorn (the HTTP server the real one runs on). This is the
  best any server, or any app on uvicorn, could score here and now.
- `--in-process`: CPU per trial cycle of the ASGI application itself, called directly (no
  HTTP, no generator).
- `--reference PYTHON`: the reference server side by side, on SQLite, run by an interpreter
  that has it. Zeus 0.8.2's wheel lacks the server; zeus-ml 0.9.1 ships the same FastAPI +
  SQLAlchemy design and needs pydantic 1:
      python -m venv /tmp/refbso && /tmp/refbso/bin/pip install \
          'zeus-ml[bso-server]==0.9.1' 'fastapi==0.110.3' 'pydantic<2' \
          'uvicorn[standard]' aiosqlite greenlet httpx

Usage:
    python benchmarks/bso_bench.py [--load ../shared/bench/bso_load.py]
        [--backends sqlite,postgres] [--cycles1 300] [--cycles32 20] [--workers 1]
        [--split N] [--floor] [--in-process] [--pg-async-commit] [--reference PYTHON]

PostgreSQL: uses $ZEUS_BSO_TEST_POSTGRES_URL, else starts one with `.ci/postgres.sh`. Its
commits are durable by default (an fsync per transaction, two per cycle);
`--pg-async-commit` sets `synchronous_commit = off` on the benchmark's database to show what
that costs.

Targets (issue 7): 32 clients >= 4x the reference's 52-60 cycles/s with p99 < 250 ms;
1 client p50 < 3 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOAD = ROOT.parent / "shared" / "bench" / "bso_load.py"
SHAPES = ((1, "cycles1"), (32, "cycles32"))


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


def wait_for(base: str, log: Path) -> None:
    for _ in range(600):
        try:
            httpx.get(f"{base}/jobs/batch_size", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"server did not start; see {log}")


@contextmanager
def serving(
    command: Callable[[int], list[str]], log_path: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """Start `command(port)` on a free port; yield its base URL and pid; stop it at the end."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command(port), stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for(base, log_path)
            yield base, server.pid
        finally:
            server.terminate()
            server.wait(timeout=30)


def run_load(args: argparse.Namespace, base: str, server_pid: int, label: str) -> None:
    """Run the generator at 1 and 32 clients; print its line and the CPU used per cycle."""
    for clients, attr in SHAPES:
        cycles = getattr(args, attr)
        before = children_cpu(server_pid)
        gen_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            [sys.executable, str(args.load), base, str(clients), str(cycles)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        used = children_cpu(server_pid) - before
        gen_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        gen = (gen_after.ru_utime - gen_before.ru_utime) + (
            gen_after.ru_stime - gen_before.ru_stime
        )
        n = clients * cycles
        print(
            f"[{label}] {out} | cpu per cycle: server {1e3 * used / n:.2f} ms, "
            f"load generator {1e3 * gen / n:.2f} ms",
            flush=True,
        )
        # Let the keep-alive policy see the previous run's connections go quiet.
        time.sleep(6)


# -- the server on SQLite and PostgreSQL ------------------------------------------------------


async def pg_admin(url: str, *statements: str) -> None:
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            for sql in statements:
                await conn.execute(sa.text(sql))
    finally:
        await engine.dispose()


def postgres_url(async_commit: bool) -> str:
    url = os.environ.get("ZEUS_BSO_TEST_POSTGRES_URL")
    if not url:
        url = subprocess.run(
            [str(ROOT / ".ci" / "postgres.sh")], check=True, capture_output=True, text=True
        ).stdout.strip()
    name = f"bso_bench_{uuid.uuid4().hex[:8]}"
    statements = [f'CREATE DATABASE "{name}"']
    if async_commit:
        statements.append(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    asyncio.run(pg_admin(url, *statements))
    return url.rsplit("/", 1)[0] + "/" + name


def drop_postgres(url: str) -> None:
    admin = url.rsplit("/", 1)[0] + "/postgres"
    name = url.rsplit("/", 1)[1]
    asyncio.run(pg_admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def database_url(backend: str, args: argparse.Namespace, tmp: Path) -> str:
    if backend == "sqlite":
        return f"sqlite+aiosqlite:///{tmp / f'bench-{uuid.uuid4().hex[:6]}.db'}"
    url = postgres_url(args.pg_async_commit)
    subprocess.run(
        [sys.executable, "-m", "zeus.optimizer.batch_size.server", "migrate"],
        env={**os.environ, "ZEUS_BSO_DATABASE_URL": url},
        check=True,
        capture_output=True,
    )
    return url


def run_backend(backend: str, args: argparse.Namespace, tmp: Path) -> None:
    url = database_url(backend, args, tmp)
    label = backend + (" async commit" if backend == "postgres" and args.pg_async_commit else "")

    def command(port: int) -> list[str]:
        return [
            *(sys.executable, "-m", "zeus.optimizer.batch_size.server", "--port", str(port)),
            *("--database-url", url, "--workers", str(args.workers)),
        ]

    try:
        with serving(command, tmp / f"server-{backend}.log") as (base, pid):
            run_load(args, base, pid, label)
            if args.split > 1:
                run_split(args, base, label)
    finally:
        if backend == "postgres":
            drop_postgres(url)


def run_split(args: argparse.Namespace, base: str, label: str) -> None:
    """The same 32 clients over several generator processes.

    Shows what the server sustains when one Python generator process is no longer the
    bottleneck.
    """
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
        f"[{label}] {args.split} generators x {per} clients: "
        f"throughput={total:.1f} cycles/s, worst p99={p99:.1f}ms",
        flush=True,
    )


# -- the floor: a server that does no work ---------------------------------------------------

_CANNED = {
    b"/jobs/batch_size": b'{"job_id":"load-x","batch_size":128,"trial_number":1}',
    b"/report": b'{"stop_train":true,"converged":true,"message":"Train succeeded"}',
    b"/jobs": b'{"job_id":"load-x"}',
}


async def _serve_canned(port: int, close: bool) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                path = lines[0].split(b" ")[1].split(b"?")[0]
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                body = _CANNED.get(path, b"{}")
                status = b"201 Created" if path == b"/jobs" else b"200 OK"
                extra = b"connection: close\r\n" if close else b""
                writer.write(
                    b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
                    b"content-length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body
                )
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def _canned_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    path = scope["path"].encode()
    body = _CANNED.get(path, b"{}")
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    status = 201 if path == b"/jobs" else 200
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _serve_canned_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(_canned_asgi, port=port, access_log=False, log_level="warning", server_header=False)


def run_floor(args: argparse.Namespace, tmp: Path) -> None:
    for flag, label in (
        ("--canned-keepalive", "floor, asyncio, keep-alive"),
        ("--canned-close", "floor, asyncio, connection: close"),
        ("--canned-uvicorn", "floor, trivial app on uvicorn"),
    ):

        def command(port: int, flag: str = flag) -> list[str]:
            return [sys.executable, __file__, flag, str(port)]

        with serving(command, tmp / "canned.log") as (base, pid):
            run_load(args, base, pid, label)


# -- the reference server, side by side ---------------------------------------------------

_REFERENCE_SCHEMA = (
    "import sys, sqlalchemy as sa\n"
    "from zeus.optimizer.batch_size.server.database.schema import Base\n"
    "Base.metadata.create_all(sa.create_engine('sqlite:///' + sys.argv[1]))\n"
)


def run_reference(args: argparse.Namespace, tmp: Path) -> None:
    db = tmp / f"reference-{uuid.uuid4().hex[:6]}.db"
    # Its own zeus, not ours: no PYTHONPATH pointing at this checkout.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["ZEUS_BSO_DATABASE_URL"] = f"sqlite+aiosqlite:///{db}"
    subprocess.run([args.reference, "-c", _REFERENCE_SCHEMA, str(db)], check=True, env=env)

    def command(port: int) -> list[str]:
        return [
            *(args.reference, "-m", "uvicorn", "zeus.optimizer.batch_size.server.router:app"),
            *("--port", str(port), "--no-access-log", "--log-level", "warning"),
        ]

    with serving(command, tmp / "reference.log", env) as (base, pid):
        run_load(args, base, pid, "reference (zeus-ml, sqlite)")


# -- in-process: the application without HTTP ------------------------------------------------


async def _asgi_call(app: Any, method: str, path: str, query: bytes, body: bytes) -> bytes:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"bench"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    chunks: list[bytes] = []
    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        else:
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    if status not in (200, 201):
        raise RuntimeError(f"{method} {path}: {status} {b''.join(chunks)!r}")
    return b"".join(chunks)


async def _in_process(url: str, cycles: int) -> float:
    from zeus.optimizer.batch_size.server.app import create_app
    from zeus.optimizer.batch_size.server.config import ZeusBsoSettings

    entry = create_app(ZeusBsoSettings(database_url=url, auto_migrate=True))
    spec = {
        "job_id": None,
        "job_id_prefix": "bench",
        "batch_sizes": [32, 64, 128, 256, 512],
        "default_batch_size": 128,
        "mab_seed": 123456,
        "max_power": 300,
        "number_of_gpus": 1,
        "gpu_model": "A40",
    }
    async with entry.running():
        jobs = []
        for _ in range(32):
            created = await _asgi_call(entry, "POST", "/jobs", b"", json.dumps(spec).encode())
            jobs.append(json.loads(created)["job_id"])

        async def cycle(job: str) -> None:
            raw = await _asgi_call(entry, "GET", "/jobs/batch_size", f"job_id={job}".encode(), b"")
            trial = json.loads(raw)
            bs = trial["batch_size"]
            result = dict(trial, time=10.0 + bs / 100, energy=1000.0 + bs, metric=0.6)
            result["current_epoch"] = 1
            await _asgi_call(entry, "POST", "/report", b"", json.dumps(result).encode())

        for job in jobs:  # Warm up.
            await cycle(job)
        start = time.process_time()
        for i in range(cycles):
            await cycle(jobs[i % len(jobs)])
        return (time.process_time() - start) / cycles


def run_in_process(backend: str, args: argparse.Namespace, tmp: Path) -> None:
    url = database_url(backend, args, tmp)
    try:
        per_cycle = asyncio.run(_in_process(url, args.cycles_in_process))
    finally:
        if backend == "postgres":
            drop_postgres(url)
    print(
        f"[{backend}, in-process] {1e6 * per_cycle:.0f} us CPU per cycle "
        f"({args.cycles_in_process} cycles over 32 jobs)",
        flush=True,
    )


BACKENDS = ("sqlite", "postgres")


def backend_list(text: str) -> list[str]:
    """Comma-separated backends for --backends; an unknown name is an error that names it."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown backend(s) {unknown or [text]}; choose from {', '.join(BACKENDS)}"
        )
    return names


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", type=Path, default=DEFAULT_LOAD)
    p.add_argument("--backends", type=backend_list, default="sqlite,postgres")
    p.add_argument("--cycles1", type=int, default=300)
    p.add_argument("--cycles32", type=int, default=20)
    p.add_argument("--cycles-in-process", type=int, default=2000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--split", type=int, default=1, help="also run 32 clients over N generators")
    p.add_argument("--floor", action="store_true", help="also measure a zero-work server")
    p.add_argument("--in-process", action="store_true", help="also measure the app in-process")
    p.add_argument("--pg-async-commit", action="store_true")
    p.add_argument("--reference", help="Python interpreter with the reference server")
    p.add_argument("--canned-keepalive", type=int, help=argparse.SUPPRESS)
    p.add_argument("--canned-close", type=int, help=argparse.SUPPRESS)
    p.add_argument("--canned-uvicorn", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.canned_uvicorn:
        _serve_canned_uvicorn(args.canned_uvicorn)
        return
    canned_port = args.canned_keepalive or args.canned_close
    if canned_port:
        asyncio.run(_serve_canned(canned_port, close=bool(args.canned_close)))
        return
    if not args.load.is_file():
        raise SystemExit(f"load generator {args.load} not found")
    print(f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    with tempfile.TemporaryDirectory(prefix="bso-bench-") as tmp:
        if args.floor:
            run_floor(args, Path(tmp))
        if args.reference:
            run_reference(args, Path(tmp))
        for backend in args.backends:
            run_backend(backend, args, Path(tmp))
            if args.in_process:
                run_in_process(backend, args, Path(tmp))
    print(f"load average {os.getloadavg()[0]:.2f} at end", flush=True)


if __name__ == "__main__":
    main()
