"""PowerMonitor cost: CPU share and memory of sampling 4 simulated GPUs every 1 ms.

Runs `PowerMonitor(update_period=0.001)` on 4 simulated GPUs on the real clock
(`ZEUS_GPU_BACKEND=sim`), lets it sample for a while with the main thread asleep, and reports:
- the CPU time the process used, as a share of one core (`time.process_time`, i.e. the
  sampling thread's cost, since the main thread sleeps), and `resource.getrusage` max RSS;
- samples taken vs the ideal (duration / period);
- bytes of timeline storage per sample per GPU (target <= 16).

Usage: python benchmarks/power_monitor.py [--seconds S] [--period P] [--gpus N]
"""

from __future__ import annotations

import argparse
import os
import resource
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--period", type=float, default=0.001)
    p.add_argument("--gpus", type=int, default=4)
    args = p.parse_args()
    os.environ["ZEUS_GPU_BACKEND"] = "sim"
    os.environ["ZEUS_SIM_GPUS"] = ",".join(["A40"] * args.gpus)
    os.environ.pop("ZEUS_SIM_CLOCK", None)
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)

    from zeus.monitor import PowerMonitor

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu0, wall0 = time.process_time(), time.perf_counter()
    pm = PowerMonitor(update_period=args.period)
    time.sleep(args.seconds)
    pm.stop()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    n = pm.num_samples
    per_sample_gpu = pm.allocated_bytes / max(n, 1) / args.gpus
    ideal = wall / args.period
    print(
        f"PowerMonitor: {args.gpus} simulated GPUs every {args.period * 1e3:g} ms for {wall:.2f} s"
    )
    print(f"  CPU: {cpu:.3f} s = {100 * cpu / wall:.2f}% of one core")
    print(f"  samples: {n} ({n / ideal * 100:.1f}% of the ideal {ideal:.0f})")
    print(
        f"  storage: {pm.bytes_per_sample:.1f} bytes/sample/GPU by layout, "
        f"{per_sample_gpu:.1f} allocated (target <= 16)"
    )
    print(f"  max RSS growth: {(rss1 - rss0) / 1024:.1f} MiB")
    print(f"  load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
