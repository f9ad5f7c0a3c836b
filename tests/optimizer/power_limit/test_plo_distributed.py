"""torch.distributed: two ranks (gloo, one simulated GPU each, different workloads) must hold the
same all-reduced measurements and settle on the same power limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zeus
from childproc import run_ranks

pytest.importorskip("torch", reason="torch is not installed")

RANK = """
import json, os, sys
import torch.distributed as dist
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)

import zeus.device.sim
from zeus.monitor import ZeusMonitor
from zeus.optimizer import GlobalPowerLimitOptimizer

if rank == 1:
    # A workload that slows down much more at low power limits than rank 0's.
    base = zeus.device.sim.workload_points(0)
    pts = [(p, t * (1 + 2.0 * (300 - p) / 200), a) for p, t, a in base]
    zeus.device.sim.set_workload(0, pts)

monitor = ZeusMonitor(gpu_indices=[0])
local = []
_end = monitor.end_window
def end_window(key, sync_cuda=True, cancel=False):
    m = _end(key, sync_cuda=sync_cuda, cancel=cancel)
    if not cancel:
        local.append((m.total_energy, m.time))
    return m
monitor.end_window = end_window

plo = GlobalPowerLimitOptimizer(monitor, wait_steps=0, warmup_steps=1, profile_steps=4)
for epoch in range(4):
    plo.on_epoch_begin()
    for _ in range(20):  # epochs end mid-profile: interruptions happen in lockstep too
        plo.on_step_begin()
        zeus.device.sim.run(0.002)
        plo.on_step_end()
    plo.on_epoch_end()
print("RESULT", json.dumps({
    "world_size": plo.optimum_selector.world_size,
    "measurements": [[m.power_limit, m.energy, m.time] for m in plo.measurements],
    "local": local,
    "optimal": plo.state.optimal_power_limit,
}), flush=True)
plo.close()
dist.destroy_process_group()
"""


def test_ranks_agree_on_reduced_measurements(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.update(
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS="A40",
        ZEUS_SIM_CLOCK="virtual",
        ZEUS_STATE_DIR=str(tmp_path / "state"),
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(zeus.__file__).resolve().parents[1]), env.get("PYTHONPATH")])
        ),
    )
    results = run_ranks(RANK, env)

    r0, r1 = results
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["measurements"] == r1["measurements"]
    assert r0["optimal"] == r1["optimal"]
    assert [m[0] for m in r0["measurements"]] == [300, 275, 250, 225, 200, 175, 150, 125, 100]
    # Energy summed and time maxed over the ranks' own windows.
    for (pl, e, t), (e0, t0), (e1, t1) in zip(r0["measurements"], r0["local"], r1["local"]):
        assert e == pytest.approx(e0 + e1), pl
        assert t == pytest.approx(max(t0, t1)), pl
    assert any(abs(a[1] - b[1]) > 1e-3 for a, b in zip(r0["local"], r1["local"]))
    # The default selector, ZeusCost(0.5, world_size=2), on the reduced profile.
    ms = r0["measurements"]
    costs = [0.5 * e + 0.5 * 300 * 2 * t for _, e, t in ms]
    assert r0["optimal"] == ms[costs.index(min(costs))][0] * 1000
