"""`python -m zeus.demo`: a tour of zeus on whatever GPUs `get_gpus()` opens.

Run it on the simulated GPU with `ZEUS_GPU_BACKEND=sim` (add `ZEUS_SIM_GPUS=A40,V100` to pick
models). It lists the GPUs, then loads them for a few seconds and prints power and energy
readings taken through the same API a real job uses.
"""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.table import Table

from zeus.device import ZeusBaseGPUError, get_gpus


def _list_gpus(console: Console) -> int:
    gpus = get_gpus()
    table = Table(title=f"GPUs ({gpus.backend} backend)")
    for col in ("index", "name", "arch", "power limit (W)", "range (W)", "energy counter"):
        table.add_column(col)
    for i in range(len(gpus)):
        lo, hi = gpus.get_power_management_limit_constraints(i)
        table.add_row(
            str(i),
            gpus.get_name(i),
            gpus.get_architecture(i),
            f"{gpus.get_power_management_limit(i) / 1000:.0f}",
            f"{lo / 1000:.0f}-{hi / 1000:.0f}",
            "yes" if gpus.supports_get_total_energy_consumption(i) else "no",
        )
    console.print(table)
    return len(gpus)


def _readings(console: Console, seconds: float) -> None:
    gpus = get_gpus()
    n = len(gpus)
    if gpus.backend == "sim":
        import zeus.sim

        for i in gpus.physical_indices:
            zeus.sim.set_busy(i, True)
    counters = [
        gpus.get_total_energy_consumption(i)
        if gpus.supports_get_total_energy_consumption(i)
        else None
        for i in range(n)
    ]
    start = gpus.now()
    console.print(f"[bold]Power and energy over {seconds:.0f} s of load[/bold]")
    while gpus.now() - start < seconds:
        time.sleep(0.5)
        cells = []
        for i in range(n):
            watts = gpus.get_average_power_usage(i) / 1000
            base = counters[i]
            if base is not None:
                joules = (gpus.get_total_energy_consumption(i) - base) / 1000
                cells.append(f"GPU{i}: {watts:6.1f} W, {joules:8.1f} J")
            else:
                cells.append(f"GPU{i}: {watts:6.1f} W, (no counter)")
        console.print(f"t={gpus.now() - start:4.1f}s  " + "  ".join(cells))


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m zeus.demo", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of the power readout")
    args = parser.parse_args(argv)
    console = Console()
    try:
        if _list_gpus(console) == 0:
            return 1
        _readings(console, args.seconds)
    except ZeusBaseGPUError as e:
        console.print(f"[red]{type(e).__name__}[/red]: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
