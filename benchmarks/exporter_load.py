"""Load on `zeus-monitor serve` with 8 calibrated simulated H100s (not a timed test).

The exporter runs on `ZEUS_GPU_BACKEND=sim ZEUS_SIM_GPUS=H100 x 8` at the default `real`
fidelity: an energy-counter read spins 3.5 ms of CPU, power reads 1 µs, readings change every
100 ms. Two phases, on one exporter process:

1. `scrapers`: N concurrent scrapers (default 50) on loopback, each on its own keep-alive
   connection, scraping every `--interval` s (default 0.1, random phase) for `--seconds`
   (default 10): p50/p99/max scrape latency, request to last byte of the body (target: p99 <
   5 ms). The latency is measured by Python threads, so it includes the client's own overhead.
2. `idle`: one scrape per second for `--idle-seconds` (default 30): the exporter's CPU as a share
   of one core from /proc/<pid>/stat (target: < 2%), and per thread from /proc/<pid>/task, so
   the sampler thread (`zeus-sampler`: energy-counter reads, power polling), the refresh thread
   (`zeus-refresh`) and the server thread (`zeus-monitor`) can be told apart.

Prints one JSON line per phase, then a readable summary.

Usage: python benchmarks/exporter_load.py [--bin PATH] [--scrapers 50] [--seconds 10]
       [--interval 0.1] [--idle-seconds 30]
Build the binary in release mode first (`cargo build --release -p zeus-monitor`; the default
--bin is target/release/zeus-monitor, else python/zeus/_bin/zeus-monitor).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def default_bin() -> Path:
    for p in (REPO / "target" / "release" / "zeus-monitor", REPO / "python/zeus/_bin/zeus-monitor"):
        if p.is_file():
            return p
    raise SystemExit("zeus-monitor is not built: cargo build --release -p zeus-monitor")


def start(binary: Path, n_gpus: int) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_")}
    env.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS=",".join(["H100"] * n_gpus))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    # A note (no RAPL here, say) may come before the line with the address.
    m = None
    while m is None and (line := proc.stderr.readline()):
        m = re.search(r"http://([\d.]+):(\d+)/metrics", line)
    if not m:
        proc.kill()
        raise SystemExit("the exporter did not print its address")
    return proc, f"{m.group(1)}:{m.group(2)}"


def scrape(conn: http.client.HTTPConnection) -> bytes:
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}")
    return body


def connect(addr: str) -> http.client.HTTPConnection:
    host, port = addr.rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=10)


def wait_ready(addr: str, n_gpus: int) -> None:
    conn = connect(addr)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if scrape(conn).count(b"\nzeus_gpu_energy_joules_total{") == n_gpus:
            return
        time.sleep(0.05)
    raise SystemExit("no energy series after 15 s")


def scrapers(addr: str, n: int, seconds: float, interval: float) -> dict:
    latencies: list[list[float]] = [[] for _ in range(n)]
    errors: list[str] = []
    start_at = time.monotonic() + 0.2
    stop_at = start_at + seconds

    def run(k: int) -> None:
        conn = connect(addr)
        scrape(conn)  # open the connection outside the measurement
        next_t = start_at + random.uniform(0, interval)
        while True:
            now = time.monotonic()
            if next_t >= stop_at:
                return
            if next_t > now:
                time.sleep(next_t - now)
            t0 = time.perf_counter()
            try:
                scrape(conn)
            except Exception as e:
                errors.append(repr(e))
                conn = connect(addr)
            latencies[k].append(time.perf_counter() - t0)
            next_t += interval

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = sorted(x for per in latencies for x in per)
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return {
        "phase": "scrapers",
        "scrapers": n,
        "seconds": seconds,
        "interval_s": interval,
        "scrapes": len(lat),
        "scrapes_per_s": len(lat) / seconds,
        "errors": len(errors),
        "p50_ms": q[49] * 1e3,
        "p99_ms": q[98] * 1e3,
        "max_ms": lat[-1] * 1e3,
        "target_p99_ms": 5.0,
    }


def cpu_ticks(pid: int) -> tuple[int, dict[str, int]]:
    def ticks(stat: str) -> tuple[str, int]:
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        return comm, int(fields[11]) + int(fields[12])  # utime + stime

    _, total = ticks(Path(f"/proc/{pid}/stat").read_text())
    threads: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm, t = ticks((task / "stat").read_text())
        except FileNotFoundError:
            continue
        threads[comm] = threads.get(comm, 0) + t
    return total, threads


def idle(addr: str, pid: int, seconds: float) -> dict:
    conn = connect(addr)
    total0, threads0 = cpu_ticks(pid)
    t0 = time.monotonic()
    k = 0
    while time.monotonic() - t0 < seconds:
        scrape(conn)
        k += 1
        time.sleep(max(0.0, t0 + k - time.monotonic()))
    wall = time.monotonic() - t0
    total1, threads1 = cpu_ticks(pid)
    share = lambda a, b: 100.0 * (b - a) / TICK / wall  # noqa: E731
    return {
        "phase": "idle",
        "seconds": wall,
        "scrapes": k,
        "cpu_percent_of_core": share(total0, total1),
        "per_thread_percent": {
            name: round(share(threads0.get(name, 0), t), 3) for name, t in sorted(threads1.items())
        },
        "target_cpu_percent": 2.0,
        "clk_tck": TICK,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, default=None)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrapers", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    args = ap.parse_args()
    binary = args.bin or default_bin()
    proc, addr = start(binary, args.gpus)
    try:
        wait_ready(addr, args.gpus)
        time.sleep(1.0)  # past the sampler's start-up
        a = scrapers(addr, args.scrapers, args.seconds, args.interval)
        print(json.dumps(a), flush=True)
        b = idle(addr, proc.pid, args.idle_seconds)
        print(json.dumps(b), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    print(f"binary: {binary}; {args.gpus} simulated H100 (real fidelity)")
    print(
        f"{a['scrapers']} scrapers x every {a['interval_s']:g} s for {a['seconds']:g} s: "
        f"{a['scrapes']} scrapes ({a['scrapes_per_s']:.0f}/s), {a['errors']} errors; "
        f"latency p50 {a['p50_ms']:.2f} ms, p99 {a['p99_ms']:.2f} ms, max {a['max_ms']:.2f} ms "
        f"(target p99 < 5 ms: {'met' if a['p99_ms'] < 5 else 'MISSED'})"
    )
    threads = ", ".join(f"{k} {v:.2f}%" for k, v in b["per_thread_percent"].items())
    print(
        f"1 scrape/s for {b['seconds']:.0f} s: exporter CPU {b['cpu_percent_of_core']:.2f}% of "
        f"one core (target < 2%: {'met' if b['cpu_percent_of_core'] < 2 else 'MISSED'}); "
        f"by thread: {threads}"
    )
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
