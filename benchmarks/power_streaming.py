"""CPU cost of `PowerStreamingClient` watching several nodes' zeusd streams.

Starts `--nodes` zeusd daemons on this machine (release build), each on `--gpus` simulated
H100s streaming at zeusd's default 20 Hz, and one client streaming every GPU of every node. It
prints the client's CPU use (this process, all threads, from `time.process_time`) as % of one
core, and the readings per second it applied (the target is 20 per GPU).

Usage: python benchmarks/power_streaming.py [--no-build] [--nodes 4] [--gpus 8] [--seconds 20]
Target: the client under 10 % of a core for 4 nodes x 8 GPUs (640 readings/s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zeusd_load import ROOT, cpu_seconds, start

sys.path.insert(0, str(ROOT / "python"))

from zeus.monitor.power_streaming import PowerStreamingClient, ZeusdUdsConfig


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "zeusd"], cwd=ROOT, check=True)
    models = ",".join(["H100"] * args.gpus)
    with tempfile.TemporaryDirectory() as d:
        daemons, servers = [], []
        try:
            for n in range(args.nodes):
                sock = Path(d) / f"node{n}.sock"
                daemons.append(start(sock, Path(d) / f"state{n}", models, "gpu-read"))
                servers.append(ZeusdUdsConfig(socket_path=str(sock), cpu_indices=[]))
            with PowerStreamingClient(servers) as client:
                time.sleep(1.0)  # every stream connected and flowing
                v0, c0, t0 = client._version, time.process_time(), time.monotonic()
                z0 = sum(cpu_seconds(p.pid) for p in daemons)
                time.sleep(args.seconds)
                v1, c1, t1 = client._version, time.process_time(), time.monotonic()
                z1 = sum(cpu_seconds(p.pid) for p in daemons)
                seen = client.get_power()
            wall = t1 - t0
            gpus = args.nodes * args.gpus
            print(
                f"PowerStreamingClient, {args.nodes} nodes x {args.gpus} simulated H100s over "
                f"Unix sockets, {wall:.1f} s: client CPU {100 * (c1 - c0) / wall:.2f} % of a "
                f"core; {(v1 - v0) / wall:.0f} readings/s applied "
                f"({(v1 - v0) / wall / gpus:.2f} per GPU, 20 asked); the {args.nodes} daemons "
                f"together {100 * (z1 - z0) / wall:.2f} % of a core"
            )
            assert sum(len(r.gpu_power_w) for r in seen.values()) == gpus, seen
            print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
        finally:
            for p in daemons:
                p.terminate()
                p.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
