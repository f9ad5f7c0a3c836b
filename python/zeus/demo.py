"""`python -m zeus.demo`: a tour of zeus on whatever GPUs `get_gpus()` opens.

Run it on the simulated GPU with `ZEUS_GPU_BACKEND=sim` (add `ZEUS_SIM_GPUS=A40,V100` to pick
models). It lists the GPUs; measures a few seconds of load with `ZeusMonitor` and
`PowerMonitor`; then runs a short training loop under `GlobalPowerLimitOptimizer`, which
profiles GPU 0's power limits, settles on the one with the lowest Zeus cost and reports the
energy saved against the maximum. On the simulated GPU the training loop runs on the
simulator's virtual clock, so that a busy machine cannot make one limit look faster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

from zeus.device import get_gpus
from zeus.util import cli
from zeus.util.metric import zeus_cost


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


def _monitored_workload(console: Console, seconds: float, plot: str | None) -> None:
    """Load the GPUs for `seconds` under a ZeusMonitor window and a PowerMonitor."""
    import zeus.device.sim
    from zeus.monitor import PowerMonitor, ZeusMonitor

    gpus = get_gpus()
    n = len(gpus)
    monitor = ZeusMonitor()
    console.print(f"[bold]A monitored workload: {seconds:.0f} s, busy and idle phases[/bold]")
    with PowerMonitor(update_period=0.05) as power:
        # The first window looks for a framework to sync CUDA with (importing PyTorch if it is
        # installed takes a while), so start the clock after it opened.
        monitor.begin_window("workload")
        start = phase_start = gpus.now()
        busy = True
        while gpus.now() - start < seconds:
            if gpus.backend == "sim":
                for i in gpus.physical_indices:
                    zeus.device.sim.set_busy(i, busy)
            time.sleep(0.5)
            watts = "  ".join(f"GPU{i}: {gpus.get_power_usage(i) / 1000:6.1f} W" for i in range(n))
            console.print(f"t={gpus.now() - start:4.1f}s  {'busy' if busy else 'idle'}  {watts}")
            if gpus.now() - phase_start >= 1.0:
                busy, phase_start = not busy, gpus.now()
        m = monitor.end_window("workload")
        end = gpus.now()
        by_timeline = power.get_energy(start, end) or {}
        times, series = power.timeline()
    if gpus.backend == "sim":
        for i in gpus.physical_indices:
            zeus.device.sim.set_busy(i, False)
    table = Table(title=f"ZeusMonitor window 'workload': {m.time:.2f} s")
    for col in ("GPU", "energy (J)", "average power (W)", "PowerMonitor timeline (J)"):
        table.add_column(col)
    for i, joules in m.energy.items():
        tl = by_timeline.get(i)
        table.add_row(
            str(i),
            f"{joules:.1f}",
            f"{joules / m.time:.1f}",
            "-" if tl is None else f"{tl:.1f}",
        )
    console.print(table)
    if plot:
        _plot_power(console, plot, times, series)


def _plot_power(console: Console, path: str, times: list[float], series: dict) -> None:
    """The workload's power timeline, drawn as `python -m zeus.analyze plot` draws a log."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        console.print("(matplotlib is not installed: no plot)")
        return
    from zeus.analyze import PowerSeries, plot_power

    gpus = get_gpus()
    names = {i: gpus.get_name(i) for i in range(len(gpus))}
    timeline = PowerSeries(times=list(times), watts={g: list(w) for g, w in series.items()})
    plot_power(
        [timeline], path, names, size=(900, 450), title="GPU power during the demo's workload"
    )
    console.print(f"power timeline plotted to {path}")


def _power_limit_optimizer_on_virtual_clock(console: Console) -> int:
    """Run the optimizer part in a child process whose simulated GPUs keep a virtual clock.

    On the real clock a simulated step sleeps, and on a busy machine a sleep overshoots by
    milliseconds: a 20 ms step then looks up to tens of percent slower at random, enough to
    show a lower power limit running faster. The virtual clock times the simulated GPU's own
    work, so the table compares the limits and nothing else.
    """
    console.file.flush()
    env = dict(os.environ, ZEUS_SIM_CLOCK="virtual")
    env.pop("ZEUS_SIM_SHARED", None)  # a shared device keeps real time
    return subprocess.run(
        [sys.executable, "-m", "zeus.demo", "--optimizer-only"], env=env, check=False
    ).returncode


def _power_limit_optimizer(console: Console) -> None:
    """Profile GPU 0's power limits on a short training loop and report the choice."""
    import zeus.device.sim
    from zeus.monitor import ZeusMonitor
    from zeus.optimizer.power_limit import Done, GlobalPowerLimitOptimizer

    gpus = get_gpus()
    console.print(
        "[bold]GlobalPowerLimitOptimizer on GPU 0: scan the power limits, keep the one of "
        "least cost (ZeusCost, eta 0.5: energy and time weighed equally)[/bold]"
    )
    # Work per training step, in seconds at the maximum power limit. On the virtual clock a
    # step costs nothing to run, so steps can last as long as real ones and a profiling window
    # span 50 updates of the energy counter (every 0.1 s); on the real clock the demo stays
    # short.
    virtual = gpus.virtual_clock
    step_work, profile_steps = (0.25, 20) if virtual else (0.02, 6)
    if virtual:
        console.print(
            "(timed on the simulated GPU's virtual clock: how busy this machine is does not "
            "change the times)"
        )
    monitor = ZeusMonitor(gpu_indices=[0])
    plo = GlobalPowerLimitOptimizer(
        monitor, warmup_steps=2, profile_steps=profile_steps, pl_step=25
    )
    physical = gpus.physical_indices[0]
    with plo:
        steps = 0
        while not isinstance(plo.state, Done) and steps < 2000:
            if steps % 50 == 0:
                plo.on_epoch_begin()
            plo.on_step_begin()
            if gpus.backend == "sim":
                zeus.device.sim.run(step_work, [physical])
            else:  # On a real GPU this is where a training step would run.
                time.sleep(step_work)
            plo.on_step_end()
            steps += 1
            if steps % 50 == 0:
                plo.on_epoch_end()
        chosen = plo.current_power_limit
    # The selector's cost, so the table shows why the choice is not simply the least energy.
    max_power_w = gpus.get_power_management_limit_constraints(0)[1] / 1000
    cost = {m.power_limit: zeus_cost(m.energy, m.time, 0.5, max_power_w) for m in plo.measurements}
    table = Table(title=f"profiled power limits ({profile_steps} steps each)")
    for col in ("power limit (W)", "energy (J)", "time (s)", "cost (ZeusCost, eta 0.5)"):
        table.add_column(col)
    for meas in plo.measurements:
        mark = " <- least" if cost[meas.power_limit] == min(cost.values()) else ""
        table.add_row(
            str(meas.power_limit),
            f"{meas.energy:.2f}",
            f"{meas.time:.3f}",
            f"{cost[meas.power_limit]:.2f}{mark}",
        )
    console.print(table)
    by_pl = {meas.power_limit: meas for meas in plo.measurements}
    top, best = by_pl[max(by_pl)], by_pl[chosen // 1000]
    console.print(
        f"chosen: {chosen // 1000} W (ZeusCost, eta=0.5): "
        f"{1 - best.energy / top.energy:.1%} less energy than at {top.power_limit} W, "
        f"{best.time / top.time - 1:+.1%} time per step; the original limit is restored on exit"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; expected errors are one line and a hint (`zeus.util.cli`)."""
    return cli.run("python -m zeus.demo", _main, argv)


def _main(argv: list[str]) -> int:
    parser = cli.Parser(prog="python -m zeus.demo", description=__doc__)
    parser.add_argument(
        "--seconds", type=cli.positive_float, default=4.0, help="length of the workload"
    )
    parser.add_argument("--plot", metavar="PNG", help="plot the power timeline (needs matplotlib)")
    parts = parser.add_mutually_exclusive_group()
    parts.add_argument(
        "--skip-optimizer", action="store_true", help="do not run the power-limit optimizer"
    )
    parts.add_argument(
        "--optimizer-only", action="store_true", help="run only the power-limit optimizer"
    )
    args = parser.parse_args(argv)
    # The optimizer logs every step of its scan at INFO; the tables below say it more briefly.
    os.environ.setdefault("ZEUS_LOG_LEVEL", "WARNING")
    console = Console()
    if args.optimizer_only:
        _power_limit_optimizer(console)
        return 0
    if _list_gpus(console) == 0:
        return 1
    _monitored_workload(console, args.seconds, args.plot)
    if args.skip_optimizer:
        return 0
    gpus = get_gpus()
    if gpus.backend == "sim" and not gpus.virtual_clock:
        return _power_limit_optimizer_on_virtual_clock(console)
    _power_limit_optimizer(console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
