"""Power-limit optimization on the simulated GPU: profile, choose, and count the energy saved.

A toy training loop (each step does a fixed amount of work on the simulated A40, on a virtual
clock, so this runs in seconds) is driven by `GlobalPowerLimitOptimizer`. The optimizer scans
the power limits from 300 W down to 100 W, measures each, and settles on the one with the least
Zeus cost. The workload curve is the Zeus trace's ImageNet/ResNet-50 (batch 256) on an A40 when
the trace is available (`--trace`; by default the copy of the Zeus traces shipped with zeus,
`zeus.simulate.TRACE_DIR`), else the simulator's default curve. Whatever the curve, a
step lasts a quarter of a (virtual) second at the maximum limit, as a real training step might:
a profiling window of 20 steps then spans many updates of the GPU's energy counter (every 0.1 s),
which is what a window needs to measure energy at all.

Run:
    python examples/power_limit_demo.py [--trace /path/to/summary_power_a40.csv] [--eta 0.5]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile

# Opt in to the simulated GPU on a virtual clock before zeus opens any GPU.
os.environ.setdefault("ZEUS_GPU_BACKEND", "sim")
os.environ.setdefault("ZEUS_SIM_GPUS", "A40")
os.environ.setdefault("ZEUS_SIM_CLOCK", "virtual")
# Keep the demo's crash journal out of the user's state directory.
os.environ.setdefault("ZEUS_STATE_DIR", tempfile.mkdtemp(prefix="zeus-demo-state-"))

import zeus.device.sim
from zeus.monitor import ZeusMonitor
from zeus.optimizer import GlobalPowerLimitOptimizer
from zeus.optimizer.power_limit import Done, ZeusCost
from zeus.simulate import TRACE_DIR

STEP_SECONDS = 0.25  # how long one training step takes at the maximum power limit


def load_curve(path: str) -> list[tuple[float, float, float]]:
    """`(power_limit, time_per_epoch, average_power)` points of one trace configuration."""
    with open(path, newline="") as f:
        return [
            (float(r["power_limit"]), float(r["time_per_epoch"]), float(r["average_power"]))
            for r in csv.DictReader(f)
            if (r["dataset"], r["network"], r["batch_size"]) == ("imagenet", "resnet50", "256")
        ]


def main() -> None:
    """Train under the optimizer and report what it chose."""
    default_trace = os.fspath(TRACE_DIR / "summary_power_a40.csv")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=default_trace, help="Zeus power trace CSV (A40)")
    ap.add_argument("--eta", type=float, default=0.5, help="energy-vs-time knob in [0, 1]")
    ap.add_argument("--steps", type=int, default=2000, help="training steps in total")
    args = ap.parse_args()

    if os.path.isfile(args.trace):
        zeus.device.sim.set_workload(0, load_curve(args.trace))
        print(f"workload: ImageNet/ResNet-50 (batch 256) from {os.path.normpath(args.trace)}")
    else:
        print("workload: the simulator's default A40 curve")

    # The work is a fraction of the curve's epoch, whose length differs by orders of magnitude
    # between workloads; fix the step's duration instead.
    points = zeus.device.sim.workload_points(0)
    epoch_seconds_at_max = max(points)[1]
    work_per_step = STEP_SECONDS / epoch_seconds_at_max

    monitor = ZeusMonitor(gpu_indices=[0])
    plo = GlobalPowerLimitOptimizer(
        monitor, ZeusCost(eta_knob=args.eta), warmup_steps=5, profile_steps=20
    )
    with plo:  # the original power limit comes back at the end, whatever happens
        monitor.begin_window("training")
        steps_per_epoch = 300
        done_at = None
        for step in range(args.steps):
            if step % steps_per_epoch == 0:
                plo.on_epoch_begin()
            plo.on_step_begin()
            zeus.device.sim.run(work_per_step)  # the "training step"
            plo.on_step_end()
            if done_at is None and isinstance(plo.state, Done):
                done_at = step
            if step % steps_per_epoch == steps_per_epoch - 1:
                plo.on_epoch_end()
        total = monitor.end_window("training")

    if not isinstance(plo.state, Done):
        sys.exit(f"profiling did not finish within {args.steps} steps; raise --steps")
    print("\nprofiled power limits (energy and time of 20 steps):")
    for m in plo.measurements:
        print(f"  {m.power_limit:4d} W  {m.energy:9.1f} J  {m.time:7.2f} s")
    chosen = plo.state.optimal_power_limit // 1000
    by_pl = {m.power_limit: m for m in plo.measurements}
    top = by_pl[max(by_pl)]
    best = by_pl[chosen]
    print(f"\nchosen power limit: {chosen} W (ZeusCost, eta={args.eta})")
    saved = 1 - best.energy / top.energy
    slower = best.time / top.time - 1
    print(
        f"per step at {chosen} W vs {top.power_limit} W: {saved:.1%} less energy, "
        f"{slower:+.1%} time"
    )
    steps_after = args.steps - 1 - (done_at if done_at is not None else args.steps)
    if steps_after > 0:
        saved_j = steps_after * (top.energy - best.energy) / 20
        print(
            f"over the {steps_after} steps trained after profiling: {saved_j:.0f} J saved "
            f"(whole run: {total.total_energy:.0f} J in {total.time:.0f} s)"
        )


if __name__ == "__main__":
    main()
