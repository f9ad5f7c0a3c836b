"""`python -m zeus.monitor energy|power`: measure from the command line until Ctrl-C.

- `energy`: one measurement window over the whole run; prints the `Measurement` at the end.
- `power`: a `PowerMonitor`; shows live power per GPU and, at the end, the total time and
  energy integrated from the timeline.

Both show a live view (rich) while running and print a summary on Ctrl-C (or SIGTERM).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m zeus.monitor",
        description="Measure GPU energy or power until interrupted (Ctrl-C).",
    )
    sub = p.add_subparsers(dest="mode", required=True, metavar="{energy,power}")
    e = sub.add_parser("energy", help="Total time and energy of the whole run.")
    e.add_argument(
        "--gpu-indices", type=int, nargs="+", default=None, help="GPUs to measure (default: all)"
    )
    w = sub.add_parser("power", help="Live power per GPU, and energy at the end.")
    w.add_argument(
        "--gpu-indices", type=int, nargs="+", default=None, help="GPUs to sample (default: all)"
    )
    w.add_argument(
        "--update-period",
        type=float,
        default=None,
        help="Seconds between samples (default: half the GPUs' power update period)",
    )
    return p


def _sigterm_as_interrupt() -> None:
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _table(title: str, rows: dict[str, str]) -> Table:
    t = Table(title=title)
    t.add_column("")
    t.add_column("value", justify="right")
    for k, v in rows.items():
        t.add_row(k, v)
    return t


def _energy(args: argparse.Namespace, console: Console) -> None:
    from zeus.monitor import ZeusMonitor

    monitor = ZeusMonitor(gpu_indices=args.gpu_indices)
    gpus = monitor.gpus
    start = gpus.now()
    monitor.begin_window("zeus.monitor.energy", sync_cuda=False)
    console.print(f"Measuring energy of GPUs {monitor.gpu_indices}; Ctrl-C to stop.")
    try:
        with Live(console=console, refresh_per_second=4, transient=True) as live:
            while True:
                rows = {"elapsed (s)": f"{gpus.now() - start:.1f}"}
                for i in monitor.gpu_indices:
                    rows[f"GPU{i} power (W)"] = f"{gpus.get_average_power_usage(i) / 1000:.1f}"
                live.update(_table("zeus.monitor energy (Ctrl-C to stop)", rows))
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    measurement = monitor.end_window("zeus.monitor.energy", sync_cuda=False)
    console.print(f"Total energy (J): {measurement}")


def _power(args: argparse.Namespace, console: Console) -> None:
    from zeus.device import get_gpus
    from zeus.monitor import PowerMonitor

    gpus = get_gpus()
    monitor = PowerMonitor(gpu_indices=args.gpu_indices, update_period=args.update_period)
    start = gpus.now()
    refresh = max(monitor.update_period, 0.1)
    console.print(
        f"Sampling power of GPUs {monitor.gpu_indices} every {monitor.update_period:g} s; "
        "Ctrl-C to stop."
    )
    try:
        with Live(console=console, refresh_per_second=10, transient=True) as live:
            while True:
                if not monitor.running:
                    monitor.sample_now()  # virtual clock: sampling is ours to drive
                power = monitor.get_power() or {}
                rows = {f"GPU{i} (W)": f"{w:.1f}" for i, w in power.items()}
                live.update(_table(f"zeus.monitor power, every {monitor.update_period:g} s", rows))
                time.sleep(refresh)
    except KeyboardInterrupt:
        pass
    end = gpus.now()
    monitor.sample_now()
    monitor.stop()
    energy = monitor.get_energy(start, end) or {}
    console.print(f"Total time (s): {end - start:.3f}")
    console.print("Total energy (J): " + repr({f"GPU{i}": round(e, 3) for i, e in energy.items()}))
    console.print(f"Samples: {monitor.num_samples} at {monitor.update_period:g} s")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = _parser().parse_args(argv)
    console = Console()
    _sigterm_as_interrupt()
    try:
        if args.mode == "energy":
            _energy(args, console)
        else:
            _power(args, console)
    except ValueError as e:
        console.print(f"error: {e}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
