"""The calibrated simulated GPU (`ZEUS_SIM_FIDELITY=real`) and the energy sampler on it.

These run on the real clock: the sampler is a thread that watches the driver's updates in real
time, and the simulated H100 publishes them every 100 ms as the real one does.
"""

from __future__ import annotations

import csv
import time
import warnings

import pytest
import zeus.device.sim
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zeus.monitor import PowerMonitor, ZeusMonitor


@pytest.fixture
def h100(sim_gpus):
    """One simulated H100 at real fidelity on the real clock."""
    return sim_gpus("H100", clock="real", fidelity="real")


def _units(gpus, seconds: float) -> float:
    """Run the GPU busy for about `seconds` of measured work; returns the units done."""
    t_unit = zeus.device.sim.steady_state(0)[0]
    units = max(1.0, round(seconds / t_unit))
    duration = zeus.device.sim.run(units)
    time.sleep(duration)
    return units


@pytest.mark.parametrize("sweep", ["power_limit", "clock"])
def test_the_simulated_h100_reproduces_the_measured_sweeps(sim_gpus, shared_data, sweep):
    """Every workload, every power limit or locked clock of the H100 files, within 5%."""
    path = shared_data / "h100" / f"h100_{sweep}_sweep.csv"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    rows = list(csv.DictReader(path.open()))
    assert rows
    for workload in sorted({r["workload"] for r in rows}):
        gpus = sim_gpus("H100", clock="virtual", fidelity="real", workload=workload)
        for r in (r for r in rows if r["workload"] == workload):
            if sweep == "power_limit":
                gpus.set_power_management_limit(0, int(float(r["power_limit_w"]) * 1000))
            else:
                mhz = int(r["sm_clock_mhz"])
                gpus.set_gpu_locked_clocks(0, mhz, mhz)
            # A measurement as on the real board: 3 s of units, counter read before and after
            # (the counter's staleness adds at most a period of idle power: under 1%).
            zeus.device.sim.advance(0.5)
            e0 = gpus.get_total_energy_consumption(0)
            busy, units = 0.0, 0
            while busy < 3.0:
                busy += zeus.device.sim.run(1.0)
                units += 1
            zeus.device.sim.advance(0.2)  # the counter publishes the last update late
            t = busy / units
            e = (gpus.get_total_energy_consumption(0) - e0) / 1000.0 / units
            want_t, want_e = float(r["time_per_unit_s"]), float(r["energy_per_unit_j"])
            where = f"{workload} {sweep} {r.get('power_limit_w') or r.get('sm_clock_mhz')}"
            assert abs(t - want_t) / want_t < 0.05, f"{where}: {t} s vs {want_t} s"
            assert abs(e - want_e) / want_e < 0.05, f"{where}: {e} J vs {want_e} J"
            gpus.reset_gpu_locked_clocks(0)
            gpus.reset_power_management_limit(0)


def test_real_fidelity_readings_step_every_update_period(h100):
    gpus = h100
    zeus.device.sim.set_busy(0)
    seen = {"energy": set(), "instant": set(), "average": set()}
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        seen["instant"].add(gpus.get_instant_power_usage(0))
        seen["average"].add(gpus.get_average_power_usage(0))
        time.sleep(0.002)
    for _ in range(5):
        seen["energy"].add(gpus.get_total_energy_consumption(0))
    # About ten values a second, not hundreds.
    assert 8 <= len(seen["instant"]) <= 12, seen["instant"]
    assert 8 <= len(seen["average"]) <= 12
    assert gpus.get_power_update_period(0) == pytest.approx(0.1)
    # An energy read costs the caller milliseconds of CPU, a power read microseconds.
    t = time.perf_counter()
    gpus.get_total_energy_consumption(0)
    assert time.perf_counter() - t >= 0.0035
    t = time.thread_time()
    for _ in range(100):
        gpus.get_instant_power_usage(0)
    assert (time.thread_time() - t) / 100 < 0.001


def test_auto_reads_use_the_sampler_on_a_real_driver_and_direct_on_an_ideal_one(sim_gpus):
    sim_gpus("H100", clock="real", fidelity="real")
    assert ZeusMonitor(reads="auto")._reads_cached == [True]
    sim_gpus("H100", clock="real", fidelity="ideal")
    assert ZeusMonitor(reads="auto")._reads_cached == [False]
    sim_gpus("H100", clock="virtual", fidelity="real")
    assert ZeusMonitor()._reads_cached == [False]
    with pytest.raises(ValueError, match="virtual clock"):
        ZeusMonitor(reads="cached")
    with pytest.raises(ValueError, match='"often"'):
        ZeusMonitor(reads="often")  # type: ignore[arg-type]


def _busy_window(
    monitor: ZeusMonitor, seconds: float, exact: bool = False
) -> tuple[float, float, float]:
    """A window with the load stepping at its edges: (measured J, true J, bound J).

    The truth is taken at the instants the monitor recorded, not around its calls: on a loaded
    machine the process can be preempted between a call and a read beside it."""
    monitor.begin_window("w", sync_cuda=False)
    start = monitor.measurement_states["w"].time
    zeus.device.sim.set_busy(0, True)
    time.sleep(seconds)
    zeus.device.sim.set_busy(0, False)
    m = monitor.end_window("w", sync_cuda=False, exact=exact)
    truth = zeus.device.sim.true_energy(0, start + m.time) - zeus.device.sim.true_energy(0, start)
    return m.energy[0], truth, m.gpu_energy_uncertainty[0]


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    windows=st.lists(
        st.tuples(st.floats(0.0, 0.4), st.floats(0.2, 1.5), st.booleans()),
        min_size=1,
        max_size=3,
    )
)
def test_cached_window_energy_is_within_3_percent_short_and_1_percent_long(h100, windows):
    """Random idle gaps and window lengths, the load stepping at the window edges: within the
    rule, or (a sampler starved by a busy machine) within the bound it reports."""
    warnings.simplefilter("ignore")  # short windows warn once; not what this checks
    monitor = ZeusMonitor(reads="cached")
    try:
        time.sleep(0.35)  # the sampler's first counter anchor
        for gap, length, exact in windows:
            time.sleep(gap)
            got, truth, bound = _busy_window(monitor, length, exact)
            rule = 0.01 if length >= 1.0 else 0.03
            err = abs(got - truth)
            # A ~95% bound: 1.5x it is a 3-sigma miss.
            assert err <= rule * truth or err <= 1.5 * bound, (length, got, truth, bound)
    finally:
        # A failure's traceback keeps this frame: without the monitor in it, the sampler
        # thread stops as it should, and the lifetime tests after this one see no leftover.
        del monitor


def test_direct_reads_on_the_calibrated_gpu_are_stale_as_on_real_hardware(h100):
    warnings.simplefilter("ignore")
    monitor = ZeusMonitor(reads="direct")
    errors = []
    for _ in range(4):
        time.sleep(0.13)
        got, truth, _ = _busy_window(monitor, 0.25)
        errors.append(abs(got - truth) / truth)
    assert max(errors) > 0.05, errors


def test_power_monitor_domains_on_a_load_step(h100):
    """Integrated over a window aligned with a 4 s load step, instant power is off by at most
    one update period of the step (its reading changes only then) and the trailing 1 s average
    lags by about half its window (the H100 measured -10.9%); with idle margins on both sides
    the average is within 2%, and instant power's lags at the two steps, each up to an update
    period, cancel but for up to one period of the step (a CI run was 2.06% off: 0.098 s of
    it)."""
    with PowerMonitor(update_period=0.05, power_domains=["device_instant", "device_average"]) as pm:
        assert pm.power_domains == ["device_instant", "device_average"]
        time.sleep(1.5)
        t_a, e_a = time.time(), zeus.device.sim.true_energy(0)
        time.sleep(1.0)
        t0, e0 = time.time(), zeus.device.sim.true_energy(0)
        zeus.device.sim.set_busy(0, True)
        time.sleep(4.0)
        zeus.device.sim.set_busy(0, False)
        t1, e1 = time.time(), zeus.device.sim.true_energy(0)
        time.sleep(1.5)
        t_b, e_b = time.time(), zeus.device.sim.true_energy(0)
    aligned = {d: pm.get_energy(t0, t1, power_domain=d)[0] for d in pm.power_domains}
    margins = {d: pm.get_energy(t_a, t_b, power_domain=d)[0] for d in pm.power_domains}
    step_w = zeus.device.sim.steady_state(0)[1] - 70.0  # busy minus the H100's idle draw
    assert abs(aligned["device_instant"] - (e1 - e0)) <= 0.1 * step_w + 0.01 * (e1 - e0)
    assert aligned["device_average"] < 0.93 * (e1 - e0)  # the lag
    assert abs(margins["device_instant"] - (e_b - e_a)) <= 0.1 * step_w + 0.005 * (e_b - e_a)
    assert margins["device_average"] == pytest.approx(e_b - e_a, rel=0.02)
    assert pm.get_energy(t0, t1) == pm.get_energy(t0, t1, power_domain="device_instant")
    with pytest.raises(ValueError, match="unknown power domain"):
        pm.get_energy(t0, t1, power_domain="device_average_x")
    with PowerMonitor(update_period=0.05) as only_instant:
        with pytest.raises(ValueError, match="not monitored"):
            only_instant.get_energy(t0, t1, power_domain="device_average")
    with pytest.raises(ValueError, match="memory_average"):
        PowerMonitor(power_domains=["memory_average"])


def test_power_monitor_default_domain_is_instant_where_every_gpu_has_it(sim_gpus):
    sim_gpus("H100,A40", clock="virtual")
    assert PowerMonitor().power_domains == ["device_instant"]
    sim_gpus("H100,V100", clock="virtual")  # the V100 has no instant power field
    assert PowerMonitor().power_domains == ["device_average"]
    with pytest.raises(ValueError, match="GPU 1"):
        PowerMonitor(power_domains=["device_instant"])


NVML_FACE_PROBE = """
import json, time, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
t = time.perf_counter()
pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
read_s = time.perf_counter() - t
powers, energies = set(), set()
end = time.perf_counter() + 0.5
while time.perf_counter() < end:
    powers.add(pynvml.nvmlDeviceGetPowerUsage(h))
    energies.add(pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
print(json.dumps({"read_s": read_s, "powers": len(powers), "energies": len(energies)}))
"""


def test_the_nvml_face_is_calibrated_too(fake_nvml_lib):
    """The simulated libnvidia-ml.so.1 behaves as the in-process model: values step every
    100 ms and an energy read costs milliseconds (nvidia-ml-py through the C ABI)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("pynvml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "CUDA_"))}
    env.update(
        LD_LIBRARY_PATH=str(fake_nvml_lib.parent),
        ZEUS_SIM_GPUS="H100",
        ZEUS_SIM_LOAD="busy",
        ZEUS_SIM_FIDELITY="real",
    )
    out = subprocess.run(
        [sys.executable, "-c", NVML_FACE_PROBE], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["read_s"] >= 0.0035
    assert 4 <= r["powers"] <= 7, r
    assert 4 <= r["energies"] <= 7, r


def test_zeus_016_timeline_export_and_measurement_names(sim_gpus):
    """`get_power_timeline`, `get_all_power_timelines` and `Measurement.gpu_energy`, as Zeus
    0.16 names them."""
    sim_gpus("A40,A40", clock="virtual")
    pm = PowerMonitor(power_domains=["device_instant", "device_average"])
    t0 = zeus.device.sim.now()
    zeus.device.sim.set_busy(1)
    for _ in range(10):
        zeus.device.sim.advance(0.1)
        pm.sample_now()
    one = pm.get_power_timeline("device_instant", gpu_index=1, start_time=t0 + 0.25)
    assert list(one) == [1]
    assert len(one[1]) == 8 and all(t >= t0 + 0.25 for t, _ in one[1])
    assert all(w > 100 for _, w in one[1])
    every = pm.get_all_power_timelines(end_time=t0 + 0.55)
    assert set(every) == {"device_instant", "device_average"}
    assert all(len(points) == 5 for points in every["device_average"].values())
    with pytest.raises(ValueError, match="GPU 3 is not monitored"):
        pm.get_power_timeline(gpu_index=3)
    # Zeus 0.16's constructor names.
    pm16 = PowerMonitor(
        gpu_update_period=0.05, max_samples_per_gpu=7, gpu_power_domains=["device_average"]
    )
    assert (pm16.update_period, pm16.max_samples) == (0.05, 7)
    assert pm16.power_domains == ["device_average"]
    with pytest.raises(ValueError, match="not both"):
        PowerMonitor(update_period=0.1, gpu_update_period=0.1)
    monitor = ZeusMonitor()
    monitor.begin_window("w", sync_cuda=False)
    zeus.device.sim.advance(1.0)
    m = monitor.end_window("w", sync_cuda=False)
    assert m.gpu_energy == m.energy and m.gpu_energy[1] > m.gpu_energy[0]
