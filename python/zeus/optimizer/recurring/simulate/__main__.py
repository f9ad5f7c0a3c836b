"""`python -m zeus.simulate`: simulate one paper workload on one GPU's traces.

Prints one JSON object with the totals; `--output` writes one CSV row per run. Without
`--trace-dir` it reads the Zeus traces shipped with zeus (`zeus.simulate.TRACE_DIR`).
"""

from __future__ import annotations

import csv
import json
import sys

from zeus.optimizer.recurring.simulate import TRACE_DIR, WORKLOADS, simulate
from zeus.util import cli


def _parser() -> cli.Parser:
    p = cli.Parser(
        prog="python -m zeus.simulate",
        description="Trace-driven simulation of a recurring job (Zeus, NSDI'23).",
    )
    p.add_argument(
        "--trace-dir",
        default=None,
        help="directory with the trace CSV files (default: the Zeus traces shipped with zeus, "
        f"{TRACE_DIR})",
    )
    p.add_argument("--gpu", required=True, help="GPU name; needs summary_power_<gpu>.csv")
    p.add_argument("--workload", required=True, help=f"one of: {', '.join(WORKLOADS)}")
    p.add_argument("--policy", default="zeus", choices=["zeus", "default"])
    p.add_argument("--seed", type=int, default=123456)
    p.add_argument("--eta", type=float, default=0.5, help="energy/time weight in [0, 1]")
    p.add_argument("--beta", type=float, default=2.0, help="early-stop factor")
    p.add_argument(
        "--recurrences",
        type=int,
        default=None,
        help="number of recurrences (default 2 x |batch sizes| x |power limits|)",
    )
    p.add_argument("--output", default=None, help="write per-run history CSV here")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    return cli.run("python -m zeus.simulate", _main, argv)


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        result, rows = simulate(
            args.trace_dir,
            args.gpu,
            args.workload,
            policy=args.policy,
            seed=args.seed,
            eta=args.eta,
            beta=args.beta,
            recurrences=args.recurrences,
        )
    except RuntimeError as e:
        raise cli.CliError(str(e), "see python -m zeus.simulate --help") from None
    if args.output:
        with open(args.output, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["rec", "try", "batch_size", "power_limit", "energy", "time", "reached"])
            for rec, attempt, bs, pl, energy, secs, reached in rows:
                w.writerow([rec, attempt, bs, pl, repr(energy), repr(secs), str(reached).lower()])
    print(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
