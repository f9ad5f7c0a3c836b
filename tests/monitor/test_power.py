"""PowerMonitor: the Rust sampling thread, the bounded timeline, energy and power queries."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zeus.device.sim
from zeus.monitor import PowerMonitor

REPO = Path(__file__).resolve().parents[2]


def test_default_period_is_half_the_update_period_capped(sim_gpus):
    sim_gpus("P100,A40")
    # The simulator publishes its boards' power update periods.
    gpus = zeus.device.get_gpus()
    periods = [gpus.get_power_update_period(i) for i in range(2)]
    pm = PowerMonitor()
    assert pm.update_period == pytest.approx(min(min(periods) / 2, 0.1))
    assert pm.update_period > 0  # never 0 (busy polling), unlike the reference
    pm.stop()


def test_virtual_clock_is_manual_and_integrates_exactly(sim_gpus):
    sim_gpus("A40,V100")
    pm = PowerMonitor(gpu_indices=[1, 0], update_period=0.01)
    assert not pm.running
    assert pm.get_power() is None
    assert pm.get_energy(0.0, 1e12) is None
    t0 = zeus.device.sim.now()
    e0 = [zeus.device.sim.true_energy(i) for i in range(2)]
    assert pm.sample_now()
    assert not pm.sample_now()  # the clock did not move
    assert pm.get_energy(t0, t0 + 1) is None  # one point is not enough
    zeus.device.sim.set_busy(0)
    for _ in range(500):
        zeus.device.sim.advance(0.01)
        pm.sample_now()
    t1 = zeus.device.sim.now()
    energy = pm.get_energy(t0, t1)
    assert list(energy) == [1, 0]
    for i in range(2):
        assert energy[i] == pytest.approx(zeus.device.sim.true_energy(i) - e0[i], rel=0.02)
    power = pm.get_power()
    assert power[0] == pytest.approx(zeus.device.sim.true_power(0), rel=0.02)
    times, cols = pm.timeline()
    assert len(times) == pm.num_samples == 501
    assert times == sorted(times)
    assert set(cols) == {0, 1}
    # get_power(t): the first sample at or after t, clamped to the last.
    assert pm.get_power(t0) == {i: cols[i][0] for i in (1, 0)}
    assert pm.get_power(times[10] - 1e-4) == {i: cols[i][10] for i in (1, 0)}
    assert pm.get_power(t0)[0] < power[0]  # idle at t0, busy at the end
    assert pm.get_power(t1 + 100) == power


def test_real_clock_background_thread_samples_and_stops(sim_gpus):
    sim_gpus("A40,V100", clock="real")
    with PowerMonitor(update_period=0.005) as pm:
        assert pm.running
        time.sleep(0.2)
        n = pm.num_samples
        assert n >= 5, n
        start, end = pm.timeline()[0][0], pm.timeline()[0][-1]
        energy = pm.get_energy(start, end)
        assert energy[0] == pytest.approx(30.0 * (end - start), rel=0.05)  # A40 idles at 30 W
    assert not pm.running
    n = pm.num_samples
    time.sleep(0.05)
    assert pm.num_samples == n
    pm.stop()  # idempotent


def test_timeline_is_bounded(sim_gpus):
    sim_gpus("A40,V100,A100,H100")
    pm = PowerMonitor(update_period=0.001, max_samples=100)
    assert pm.max_samples == 100
    for _ in range(1000):
        zeus.device.sim.advance(0.001)
        pm.sample_now()
    assert pm.num_samples == 100
    times, _ = pm.timeline()
    assert times[0] == pytest.approx(zeus.device.sim.now() - 0.099)
    assert pm.bytes_per_sample <= 16
    assert pm.allocated_bytes <= 100 * (8 + 4 * 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gpu_indices": []}, "must not be empty"),
        ({"gpu_indices": [7]}, "GPU index 7"),
        ({"update_period": 0.0}, "update_period"),
        ({"update_period": -1.0}, "got -1"),
        ({"max_samples": 0}, "max_samples"),
    ],
)
def test_bad_arguments(sim_gpus, kwargs, match):
    sim_gpus("A40")
    with pytest.raises(ValueError, match=match):
        PowerMonitor(**kwargs)


def _fake_nvml() -> Path:
    try:
        return zeus.device.sim.nvml_library_path()
    except FileNotFoundError:
        for cand in ("target/debug/libnvidia_ml.so", "target/bundle/debug/libnvidia_ml.so"):
            if (REPO / cand).is_file():
                return REPO / cand
    pytest.skip("the simulated libnvidia-ml is not built")


def test_update_period_detected_by_sampling_through_nvml(monkeypatch):
    """NVML does not publish the update period: it is detected by watching the reading change."""
    monkeypatch.setenv("ZEUS_NVML_LIB", str(_fake_nvml()))
    monkeypatch.setenv("ZEUS_SIM_GPUS", "V100")  # 20 ms update period in the simulator
    zeus.device.sim.reset()
    gpus = zeus.device.get_gpus()
    assert gpus.backend == "nvml"
    # Measured by watching the reading change (the simulated V100 updates every 20 ms).
    assert gpus.get_power_update_period(0) == pytest.approx(0.02, abs=0.006)
    pm = PowerMonitor()
    try:
        # Half of 20 ms, give or take scheduling noise on a loaded machine; never 0.
        assert 0.005 <= pm.update_period <= 0.02, pm.update_period
        assert pm.running
    finally:
        pm.stop()


def test_infer_counter_update_period_function(sim_gpus):
    from zeus.monitor.power import infer_counter_update_period

    sim_gpus("P100,A40")
    gpus = zeus.device.get_gpus()
    assert infer_counter_update_period([1]) == pytest.approx(
        min(gpus.get_power_update_period(1) / 2, 0.1)
    )
    with pytest.raises(ValueError, match="GPU index 4"):
        infer_counter_update_period([4])
