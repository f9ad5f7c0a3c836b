"""ZeusMonitor with CPU packages: GPU, CPU and DRAM energy against the simulators' truth.

The simulated CPUs are configured once per process, so each case runs in a fresh interpreter.
Their counters are files that a writer thread rewrites about every millisecond, and a loaded
machine holds that thread up for tens of milliseconds now and then (real RAPL hardware does not
lag so): a window's CPU truth is therefore bracketed, from what the writer had published before
each edge (`cpu_published_energy`) to the model's truth after it (`cpu_true_energy`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from childproc import run_python

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"
# 80 J: the package (60-120 W) wraps about once a second, and so does its DRAM (range 10 J,
# 8-14 W); wraps a sampler thread starved for a few hundred ms still does not lose.
RANGE_UJ = 80_000_000
DRAM_RANGE_UJ = RANGE_UJ // 8


def within(got: float, lo: float, hi: float, rel: float) -> bool:
    """`got` lies in [lo, hi] give or take `rel` of it."""
    return lo * (1 - rel) <= got <= hi * (1 + rel)


def run_child(code: str, env: dict[str, str]) -> dict:
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR), full.get("PYTHONPATH", "")])
    full.update(env)
    return run_python(code, full)


def test_gpu_cpu_and_dram_within_one_percent_across_wraps(tmp_path: Path) -> None:
    """Acceptance: sim GPU + one sim CPU with a small wrap range, one 3 s window."""
    log = tmp_path / "log.csv"
    r = run_child(
        f"""
        import json, time
        import zeus.device.sim as sim
        from zeus.monitor import ZeusMonitor
        m = ZeusMonitor(gpu_indices=[0], cpu_indices=[0], log_file={str(log)!r})
        sim.set_busy(0)
        g0, c0lo = sim.true_energy(0), sim.cpu_published_energy(0)
        m.begin_window("w", sync_cuda=False)
        c0hi = sim.cpu_true_energy(0)
        time.sleep(3.0)
        c1lo = sim.cpu_published_energy(0)
        r = m.end_window("w", sync_cuda=False)
        g1, c1hi = sim.true_energy(0), sim.cpu_true_energy(0)
        print(json.dumps({{
            "gpu": r.gpu_energy, "cpu": r.cpu_energy, "dram": r.dram_energy,
            "energy": r.energy, "total": r.total_energy, "range": sim.rapl_tree()[1],
            "truth": g1 - g0, "repr": repr(m),
            "cpu_lo": [c1lo[0] - c0hi[0], c1lo[1] - c0hi[1]],
            "cpu_hi": [c1hi[0] - c0lo[0], c1hi[1] - c0lo[1]],
        }}))
        """,
        {
            "ZEUS_GPU_BACKEND": "sim",
            "ZEUS_SIM_CPUS": "1",
            "ZEUS_SIM_RAPL_MAX_UJ": str(RANGE_UJ),
        },
    )
    gpu, cpu, dram = r["gpu"]["0"], r["cpu"]["0"], r["dram"]["0"]
    (lo_c, lo_d), (hi_c, hi_d) = r["cpu_lo"], r["cpu_hi"]
    assert r["range"] == RANGE_UJ
    # Both counters really wrapped inside the window, at least twice.
    assert lo_c > 2 * RANGE_UJ / 1e6 and lo_d > 2 * DRAM_RANGE_UJ / 1e6, r
    # The brackets are narrow enough to tell a wrap lost or counted twice.
    assert hi_c - lo_c < RANGE_UJ / 4e6 and hi_d - lo_d < DRAM_RANGE_UJ / 4e6, r
    assert gpu == pytest.approx(r["truth"], rel=0.01)
    assert within(cpu, lo_c, hi_c, 0.01), r
    assert within(dram, lo_d, hi_d, 0.01), r
    assert r["energy"] == r["gpu"]
    assert r["total"] == pytest.approx(gpu + cpu + dram)
    assert r["repr"] == "ZeusMonitor(gpu_indices=[0], cpu_indices=[0])"
    lines = log.read_text().splitlines()
    assert lines[0] == (
        "start_time,window_name,elapsed_time,gpu0_energy,cpu0_energy,dram0_energy,"
        "gpu0_energy_uncertainty,cpu0_energy_uncertainty,dram0_energy_uncertainty"
    )
    assert [float(x) for x in lines[1].split(",")[3:6]] == [gpu, cpu, dram]
    # The bounds: the (ideal) GPU counter is exact to its resolution, and the CPU's are
    # RAPL-tight (a read is at most one ~1 ms update stale).
    gpu_b, cpu_b, dram_b = (float(x) for x in lines[1].split(",")[6:])
    assert 0 < gpu_b <= 0.01
    assert 0 < cpu_b < 0.01 * cpu and 0 < dram_b < 0.01 * dram


def test_cpu_only_monitor_and_gpu_only_defaults(tmp_path: Path) -> None:
    log = tmp_path / "gpu.csv"
    r = run_child(
        f"""
        import json, time, pickle
        import zeus.device.sim as sim
        from zeus.monitor import ZeusMonitor, Measurement
        cpu_only = ZeusMonitor(gpu_indices=[], cpu_indices=[1])
        gpu_only = ZeusMonitor(gpu_indices=[0], log_file={str(log)!r})
        c0lo = sim.cpu_published_energy(1)
        cpu_only.begin_window("c", sync_cuda=False)
        c0hi = sim.cpu_true_energy(1)
        gpu_only.begin_window("g", sync_cuda=False)
        time.sleep(0.5)
        c1lo = sim.cpu_published_energy(1)
        a = cpu_only.end_window("c", sync_cuda=False)
        c1hi = sim.cpu_true_energy(1)
        b = gpu_only.end_window("g", sync_cuda=False)
        back = pickle.loads(pickle.dumps(a))
        print(json.dumps({{
            "gpus": cpu_only.gpus is None, "gpu_indices": cpu_only.gpu_indices,
            "a": [a.energy, a.cpu_energy, a.dram_energy, a.total_energy],
            "b": [b.cpu_energy, b.dram_energy, b.total_energy == sum(b.energy.values())],
            "cpu_indices": [cpu_only.cpu_indices, gpu_only.cpu_indices],
            "truth": [c1lo[0] - c0hi[0], c1hi[0] - c0lo[0]], "pickled": back == a,
            "differs": Measurement(a.time, a.energy) == a,
        }}))
        """,
        {"ZEUS_GPU_BACKEND": "sim", "ZEUS_SIM_CPUS": "2"},
    )
    assert r["gpus"] is True and r["gpu_indices"] == []
    energy, cpu, dram, total = r["a"]
    assert energy == {} and list(cpu) == ["1"] and list(dram) == ["1"]
    assert within(cpu["1"], *r["truth"], 0.01), r
    assert total == pytest.approx(cpu["1"] + dram["1"])
    assert r["b"] == [None, None, True]
    assert r["cpu_indices"] == [[1], None]
    assert r["pickled"] is True and r["differs"] is False
    assert log.read_text().splitlines()[0] == (
        "start_time,window_name,elapsed_time,gpu0_energy,gpu0_energy_uncertainty"
    )


def test_bad_cpu_indices_are_value_errors() -> None:
    r = run_child(
        """
        import json
        from zeus.monitor import ZeusMonitor
        from zeus.device.cpu import ZeusBaseCPUError
        errors = []
        for kw in ({"cpu_indices": [0, 0]}, {"cpu_indices": [5]}, {"cpu_indices": []},
                   {"cpu_indices": [-1]}, {"gpu_indices": []},
                   {"gpu_indices": [], "cpu_indices": []}):
            try:
                ZeusMonitor(**kw)
                errors.append(None)
            except (ValueError, ZeusBaseCPUError) as e:
                errors.append(type(e).__name__)
        print(json.dumps(errors))
        """,
        {"ZEUS_GPU_BACKEND": "sim", "ZEUS_SIM_CPUS": "1"},
    )
    # `cpu_indices=[]` is Zeus 0.16's "no CPU" (a GPU monitor); nothing at all to measure is not.
    assert r == [
        "ValueError",
        "ZeusCPUNotFoundError",
        None,
        "ValueError",
        "ValueError",
        "ValueError",
    ]


def test_open_windows_show_their_cpu_and_dram_start_energies() -> None:
    """Zeus 0.16 reads `measurement_states[name].cpu_energy` / `.dram_energy`: the packages'
    energy where the window began, on the counters' scale, so two windows' starts differ by
    the energy spent between them."""
    r = run_child(
        """
        import json, time
        import zeus.device.sim as sim
        from zeus.monitor import ZeusMonitor
        m = ZeusMonitor(gpu_indices=[0], cpu_indices=[1])
        lo0 = sim.cpu_published_energy(1)
        m.begin_window("a", sync_cuda=False)
        hi0 = sim.cpu_true_energy(1)
        time.sleep(0.3)
        lo1 = sim.cpu_published_energy(1)
        m.begin_window("b", sync_cuda=False)
        hi1 = sim.cpu_true_energy(1)
        a, b = m.measurement_states["a"], m.measurement_states["b"]
        gpu_only = ZeusMonitor(gpu_indices=[0])
        gpu_only.begin_window("g", sync_cuda=False)
        g = gpu_only.measurement_states["g"]
        print(json.dumps({
            "a": [a.cpu_energy, a.dram_energy], "b": [b.cpu_energy, b.dram_energy],
            "bracket": [lo0, hi0, lo1, hi1], "gpu_only": [g.cpu_energy, g.dram_energy],
            "total": [b.total_energy, sum(b.gpu_energy.values()) + b.cpu_energy[1]
                      + b.dram_energy[1]],
        }))
        """,
        {"ZEUS_GPU_BACKEND": "sim", "ZEUS_SIM_CPUS": "2"},
    )
    (lo0, hi0), (lo1, hi1) = r["bracket"][:2], r["bracket"][2:]
    for part in (0, 1):  # CPU package, DRAM
        start_a, start_b = r["a"][part]["1"], r["b"][part]["1"]
        assert within(start_a, lo0[part], hi0[part], 1e-6), r
        assert within(start_b, lo1[part], hi1[part], 1e-6), r
        assert start_b > start_a
    assert list(r["a"][0]) == ["1"]
    assert r["gpu_only"] == [None, None]
    assert r["total"][0] == pytest.approx(r["total"][1])
