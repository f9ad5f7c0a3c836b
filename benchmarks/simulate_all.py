"""Wall time of the trace-driven simulator: six workloads x two GPUs x five seeds.

Usage:
    python benchmarks/simulate_all.py [TRACE_DIR] [--reference /tmp/refvenv/bin/python]
        [--repeat 5] [--json out.json]

TRACE_DIR defaults to the Zeus traces shipped with zeus (`zeus.simulate.TRACE_DIR`).

Ours: `zeus.simulate` (the Zeus policy, one Rust call per simulation), timed end to end
including trace parsing (once per GPU and workload, as a user would). With `--reference`, the
same 60 simulations are run by the reference simulator (zeus-ml 0.8.2 in a throwaway venv,
`benchmarks/simulate_reference.py`) and the speed-up is reported, together with the mean
energy of both (statistical agreement).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from zeus.simulate import TRACE_DIR, WORKLOADS, load_table, simulate

GPUS = ("v100", "a40")
SEEDS = (1, 2, 3, 4, 5)


def ours(trace_dir: str) -> tuple[float, dict[tuple[str, str], list[float]]]:
    """Time all simulations; returns (seconds, energies per (gpu, workload))."""
    energies: dict[tuple[str, str], list[float]] = {}
    start = time.perf_counter()
    for gpu in GPUS:
        for w in WORKLOADS:
            table = load_table(trace_dir, gpu, w)
            energies[(gpu, w)] = [
                simulate(trace_dir, gpu, w, seed=s, table=table)[0].energy for s in SEEDS
            ]
    return time.perf_counter() - start, energies


def reference(python: str, trace_dir: str) -> tuple[float, dict[tuple[str, str], list[float]]]:
    """Run the reference in its venv; returns (seconds inside its simulator, energies)."""
    script = Path(__file__).with_name("simulate_reference.py")
    start = time.perf_counter()
    out = subprocess.run(
        [
            python,
            str(script),
            trace_dir,
            "--gpus",
            ",".join(GPUS),
            "--seeds",
            ",".join(map(str, SEEDS)),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    del start
    energies: dict[tuple[str, str], list[float]] = {}
    sim_seconds = 0.0
    for line in out.splitlines():
        r = json.loads(line)
        energies.setdefault((r["gpu"], r["workload"]), []).append(r["energy"])
        # Only the reference's simulate_one_job calls are counted (its CSV reading and
        # interpreter start are not), which understates our speed-up.
        sim_seconds += r["wall_s"]
    return sim_seconds, energies


def main() -> None:
    """Run the benchmark and print a summary."""
    p = argparse.ArgumentParser()
    p.add_argument("trace_dir", nargs="?", default=str(TRACE_DIR))
    p.add_argument("--reference", help="python of a venv with zeus-ml==0.8.2")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    times = []
    energies: dict = {}
    for _ in range(a.repeat):
        t, energies = ours(a.trace_dir)
        times.append(t)
    best = min(times)
    n = len(GPUS) * len(WORKLOADS) * len(SEEDS)
    cold = times[0]
    print(
        f"ours: {n} simulations in {cold:.3f} s cold (the first pass parses each trace file "
        f"once), {best:.3f} s warm (best of {a.repeat}), {best / n * 1e3:.2f} ms each"
    )
    figures = {"simulations": n, "ours_cold_s": cold, "ours_warm_s": best}
    if a.reference:
        ref_t, ref_e = reference(a.reference, a.trace_dir)
        print(
            f"reference: {ref_t:.1f} s in simulate_one_job; speed-up {ref_t / cold:.0f}x cold, "
            f"{ref_t / best:.0f}x warm"
        )
        figures.update(reference_s=ref_t, speedup_cold=ref_t / cold, speedup_warm=ref_t / best)
        print(f"{'gpu':5s} {'workload':13s} {'ours mean E':>12s} {'ref mean E':>12s} ratio")
        for key, es in energies.items():
            o, r = statistics.mean(es), statistics.mean(ref_e[key])
            print(f"{key[0]:5s} {key[1]:13s} {o:12.4g} {r:12.4g} {o / r:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
