"""Simulate Zeus on every paper workload and every GPU with a power trace.

Usage:
    python examples/trace_driven/run_all.py [TRACE_DIR] [--seeds 1,2,3,4,5] [--eta 0.5] [--beta 2.0]

TRACE_DIR holds `summary_train.csv` and `summary_power_<gpu>.csv` files (the Zeus traces);
without it, the Zeus traces shipped with zeus (`zeus.simulate.TRACE_DIR`: A40 and V100).
For each GPU and workload it runs the Zeus policy (pruning + Gaussian Thompson sampling over
batch sizes, just-in-time power limits) for 2·|batch sizes|·|power limits| recurrences and the
baseline (the default batch size at the maximum power limit), and prints the energy saved.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from zeus.simulate import TRACE_DIR, WORKLOADS, load_table, simulate


def gpus_in(trace_dir: Path) -> list[str]:
    """GPU names that have a power trace in `trace_dir`."""
    return sorted(
        p.stem.removeprefix("summary_power_") for p in trace_dir.glob("summary_power_*.csv")
    )


def main() -> None:
    """Run all simulations and print the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trace_dir", type=Path, nargs="?", default=TRACE_DIR)
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--eta", type=float, default=0.5)
    p.add_argument("--beta", type=float, default=2.0)
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    gpus = gpus_in(a.trace_dir)
    if not gpus:
        raise SystemExit(f"no summary_power_<gpu>.csv in {a.trace_dir}")

    header = (
        f"{'gpu':6s} {'workload':13s} {'recs':>5s} {'baseline (MJ)':>14s} {'zeus (MJ)':>10s} "
        f"{'energy saved':>12s} {'time change':>11s}  final config (bs, W) per seed"
    )
    print(header)
    print("-" * len(header))
    for gpu in gpus:
        for workload in WORKLOADS:
            table = load_table(a.trace_dir, gpu, workload)
            base, _ = simulate(a.trace_dir, gpu, workload, policy="default", eta=a.eta, table=table)
            runs = [
                simulate(a.trace_dir, gpu, workload, seed=s, eta=a.eta, beta=a.beta, table=table)[0]
                for s in seeds
            ]
            energy = statistics.mean(r.energy for r in runs)
            time = statistics.mean(r.time for r in runs)
            finals = " ".join(f"({r.final_batch_size},{r.final_power_limit})" for r in runs)
            print(
                f"{gpu:6s} {workload:13s} {base.recurrences:5d} {base.energy / 1e6:14.2f} "
                f"{energy / 1e6:10.2f} {1 - energy / base.energy:12.1%} "
                f"{time / base.time - 1:+11.1%}  {finals}"
            )


if __name__ == "__main__":
    main()
