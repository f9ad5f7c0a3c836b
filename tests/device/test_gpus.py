"""zeus.device on the in-process simulated GPU: discovery, limits, clocks, energy, errors."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import zeus.device.sim
from hypothesis import given, settings
from hypothesis import strategies as st
from zeus.device import (
    ZeusBaseGPUError,
    ZeusGPUInitError,
    ZeusGPUInvalidArgError,
    ZeusGPUNoPermissionError,
    ZeusGPUNotSupportedError,
    get_gpus,
)
from zeus.exception import ZeusBaseError


def test_lists_simulated_gpus_with_their_constraints(sim_gpus):
    gpus = sim_gpus("A40,V100")
    assert len(gpus) == 2
    assert gpus.backend == "sim"
    assert gpus.get_name(0) == "NVIDIA A40 (Simulated)"
    assert "V100" in gpus.get_name(1) and "Simulated" in gpus.get_name(1)
    assert gpus.get_power_management_limit_constraints(0) == (100_000, 300_000)
    assert gpus.get_power_management_limit_constraints(1) == (100_000, 250_000)
    assert gpus.get_power_management_limit(0) == 300_000
    assert gpus.get_architecture(1) == "volta"
    assert gpus.get_uuid(0) != gpus.get_uuid(1)


def test_power_limit_round_trips_and_out_of_range_names_value_and_range(sim_gpus):
    gpus = sim_gpus("A40")
    gpus.set_power_management_limit(0, 175_000)
    assert gpus.get_power_management_limit(0) == 175_000
    with pytest.raises(ZeusGPUInvalidArgError) as err:
        gpus.set_power_management_limit(0, 350_000)
    assert "350000" in str(err.value) and "[100000, 300000]" in str(err.value)
    assert err.value.message == str(err.value)
    assert isinstance(err.value, ZeusBaseGPUError) and isinstance(err.value, ZeusBaseError)
    assert gpus.get_power_management_limit(0) == 175_000  # nothing changed
    gpus.reset_power_management_limit(0)
    assert gpus.get_power_management_limit(0) == 300_000


def test_energy_grows_under_load_and_faster_at_higher_limit(sim_gpus):
    gpus = sim_gpus("A40,A40")
    gpus.set_power_management_limit(1, 150_000)
    zeus.device.sim.set_busy(0)
    zeus.device.sim.set_busy(1)
    e0 = [gpus.get_total_energy_consumption(i) for i in range(2)]
    zeus.device.sim.advance(10.0)
    e1 = [gpus.get_total_energy_consumption(i) for i in range(2)]
    zeus.device.sim.advance(10.0)
    e2 = [gpus.get_total_energy_consumption(i) for i in range(2)]
    for i in range(2):
        assert e0[i] < e1[i] < e2[i]
    assert e1[0] - e0[0] > e1[1] - e0[1]


def test_virtual_clock_energy_is_power_times_time(sim_gpus):
    gpus = sim_gpus("V100")
    e0 = gpus.get_total_energy_consumption(0)
    zeus.device.sim.advance(4.0)
    assert gpus.get_total_energy_consumption(0) - e0 == 100_000  # 25 W idle x 4 s, in mJ
    assert gpus.now() == pytest.approx(zeus.device.sim.now())


def test_set_power_draws_those_watts_on_the_virtual_clock(sim_gpus):
    gpus = sim_gpus("A40")
    zeus.device.sim.set_power(0, 123.0)
    assert zeus.device.sim.true_power(0) == 123.0
    assert zeus.device.sim.is_busy(0)  # above the A40's 30 W idle
    e0, c0 = zeus.device.sim.true_energy(0), gpus.get_total_energy_consumption(0)
    zeus.device.sim.advance(2.0)
    assert zeus.device.sim.true_energy(0) - e0 == pytest.approx(246.0, abs=1e-9)
    assert abs(gpus.get_total_energy_consumption(0) - c0 - 246_000) <= 1  # whole mJ
    # Clamped to the power limit of the moment.
    zeus.device.sim.set_power(0, 1000.0)
    assert zeus.device.sim.true_power(0) == 300.0
    gpus.set_power_management_limit(0, 150_000)
    assert zeus.device.sim.true_power(0) == 150.0
    zeus.device.sim.set_power(0, 10.0)
    assert not zeus.device.sim.is_busy(0)
    for bad, named in ((-1.0, "-1 W"), (float("nan"), "NaN W"), (float("inf"), "inf W")):
        with pytest.raises(ValueError, match=named):
            zeus.device.sim.set_power(0, bad)
    assert zeus.device.sim.true_power(0) == 10.0  # unchanged


def test_set_power_energy_grows_at_that_rate_on_the_real_clock(sim_gpus):
    gpus = sim_gpus("H100", clock="real")  # ideal fidelity: the counter is the exact integral
    zeus.device.sim.set_power(0, 123.0)

    def bracketed_counter() -> tuple[float, int, float]:
        # The simulator's time just before and just after a counter read.
        before = zeus.device.sim.now()
        mj = gpus.get_total_energy_consumption(0)
        return before, mj, zeus.device.sim.now()

    a0, c0, b0 = bracketed_counter()
    t0 = zeus.device.sim.now()
    time.sleep(0.05)  # some time to pass; what passed is measured, not assumed
    t1 = zeus.device.sim.now()
    a1, c1, b1 = bracketed_counter()
    # The truth between two measured instants is exactly 123 W times the time between them.
    truth = zeus.device.sim.true_energy(0, at=t1) - zeus.device.sim.true_energy(0, at=t0)
    assert truth == pytest.approx(123.0 * (t1 - t0), rel=1e-9)
    # The counter's difference lies within 123 W times the bracketing times (and a mJ of
    # truncation at each end).
    assert 123.0 * (a1 - b0) * 1000 - 1 <= c1 - c0 <= 123.0 * (b1 - a0) * 1000 + 1
    assert gpus.get_instant_power_usage(0) == 123_000


def test_clocks_and_persistence(sim_gpus):
    gpus = sim_gpus("A100")
    mem = gpus.get_supported_memory_clocks(0)
    assert mem == [1215]
    gfx = gpus.get_supported_graphics_clocks(0, 1215)
    assert gfx[0] == 1410 and gfx[-1] == 210 and gfx == sorted(gfx, reverse=True)
    assert gpus.get_supported_graphics_clocks(0) == gfx  # defaults to the top memory clock
    zeus.device.sim.set_busy(0)
    _, fast_power = zeus.device.sim.steady_state(0)
    gpus.set_gpu_locked_clocks(0, 705, 705)
    slow_time, slow_power = zeus.device.sim.steady_state(0)
    assert slow_time > 1.0 and slow_power < fast_power
    gpus.reset_gpu_locked_clocks(0)
    assert zeus.device.sim.steady_state(0)[1] == pytest.approx(fast_power)
    with pytest.raises(ZeusGPUInvalidArgError, match="900"):
        gpus.set_gpu_locked_clocks(0, 900, 600)
    gpus.set_persistence_mode(0, True)
    assert gpus.get_persistence_mode(0) is True


def test_p100_has_no_energy_counter_or_locked_clocks(sim_gpus):
    gpus = sim_gpus("P100")
    assert gpus.supports_get_total_energy_consumption(0) is False
    with pytest.raises(ZeusGPUNotSupportedError):
        gpus.get_total_energy_consumption(0)
    with pytest.raises(ZeusGPUNotSupportedError):
        gpus.set_gpu_locked_clocks(0, 800, 800)
    assert gpus.get_average_power_usage(0) > 0


def test_instant_power_where_the_device_has_it(sim_gpus):
    gpus = sim_gpus("A40,V100")
    assert gpus.get_instant_power_usage(0) == 30_000
    with pytest.raises(ZeusGPUNotSupportedError):
        gpus.get_instant_power_usage(1)


def test_unprivileged_setters_raise_no_permission(sim_gpus):
    gpus = sim_gpus("A40", privileged=False)
    with pytest.raises(ZeusGPUNoPermissionError):
        gpus.set_power_management_limit(0, 200_000)
    with pytest.raises(ZeusGPUNoPermissionError):
        gpus.set_persistence_mode(0, True)
    assert gpus.get_power_management_limit(0) == 300_000


def test_block_false_dispatches_and_returns_but_still_checks_the_index(sim_gpus):
    import time

    gpus = sim_gpus("A40")
    gpus.set_power_management_limit(0, 200_000, block=False)
    gpus.set_gpu_locked_clocks(0, 900, 900, block=False)
    deadline = time.monotonic() + 5
    while gpus.get_power_management_limit(0) != 200_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gpus.get_power_management_limit(0) == 200_000
    # Errors of the call itself are not reported without `block`, like zeusd's dispatch ...
    gpus.set_power_management_limit(0, 1, block=False)
    # ... but a GPU that does not exist is refused before anything is dispatched.
    with pytest.raises(ZeusGPUInvalidArgError, match="index 3"):
        gpus.set_power_management_limit(3, 200_000, block=False)
    gpus.reset_gpu_locked_clocks(0)


def test_index_out_of_range(sim_gpus):
    gpus = sim_gpus("A40")
    with pytest.raises(ZeusGPUInvalidArgError, match="index 3"):
        gpus.get_name(3)


def test_cuda_visible_devices_maps_indices(sim_gpus):
    gpus = sim_gpus("A40,V100,H100", visible="2,0")
    assert len(gpus) == 2
    assert "H100" in gpus.get_name(0)
    assert "A40" in gpus.get_name(1)
    assert gpus.physical_indices == [2, 0]


def test_cuda_visible_devices_uuid_form(sim_gpus):
    uuid = sim_gpus("A40,V100").get_uuid(1)
    gpus = sim_gpus("A40,V100", visible=uuid[:17])
    assert len(gpus) == 1 and "V100" in gpus.get_name(0)


@pytest.mark.parametrize("bad", ["0,7", "one", "0,0", ""])
def test_cuda_visible_devices_malformed(sim_gpus, bad):
    with pytest.raises(ZeusGPUInvalidArgError, match="CUDA_VISIBLE_DEVICES"):
        sim_gpus("A40,V100", visible=bad)


def test_unknown_preset_and_backend_name_the_value(sim_gpus, monkeypatch):
    with pytest.raises(ZeusGPUInitError, match="K80"):
        sim_gpus("A40,K80")
    monkeypatch.setenv("ZEUS_GPU_BACKEND", "cuda")
    zeus.device.sim.reset()
    with pytest.raises(ZeusGPUInitError, match="cuda"):
        get_gpus()


def test_heterogeneous_check(sim_gpus):
    gpus = sim_gpus("A40,V100")
    with pytest.raises(ZeusBaseGPUError, match="Heterogeneous"):
        get_gpus(ensure_homogeneous=True)
    assert len(gpus) == 2


def test_camel_case_aliases_of_zeus_08_warn_and_work(sim_gpus):
    gpus = sim_gpus("A40")
    with pytest.warns(DeprecationWarning):
        assert gpus.getPowerManagementLimitConstraints(0) == (100_000, 300_000)
    with pytest.warns(DeprecationWarning):
        gpus.setPowerManagementLimit(0, 200_000)
    assert gpus.get_power_management_limit(0) == 200_000


def test_without_nvml_get_gpus_raises_library_not_found_with_help():
    # A fresh interpreter: no ZEUS_GPU_BACKEND, and this machine has no libnvidia-ml.
    code = (
        "from zeus.device import get_gpus, ZeusGPULibraryNotFoundError\n"
        "try:\n    get_gpus()\nexcept ZeusGPULibraryNotFoundError as e:\n"
        "    print('RAISED', e)\nelse:\n    print('NO ERROR')\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ZEUS_")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.startswith("RAISED"), out
    assert "ZEUS_GPU_BACKEND=sim" in out and "libnvidia-ml" in out


def test_missing_custom_library_is_named(monkeypatch, tmp_path):
    code = (
        "from zeus.device import get_gpus, ZeusGPULibraryNotFoundError\n"
        "try:\n    get_gpus()\nexcept ZeusGPULibraryNotFoundError as e:\n    print(e)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("ZEUS_")}
    env["ZEUS_NVML_LIB"] = str(tmp_path / "nope.so")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "nope.so" in out


@settings(max_examples=60, deadline=None)
@given(limit=st.integers(min_value=0, max_value=1_000_000))
def test_property_set_get_round_trip_or_reject(limit):
    # hypothesis does not mix with function-scoped fixtures, so configure by hand.
    import os

    os.environ.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="H100", ZEUS_SIM_CLOCK="virtual")
    try:
        zeus.device.sim.reset()
        gpus = get_gpus()
        lo, hi = gpus.get_power_management_limit_constraints(0)
        if lo <= limit <= hi:
            gpus.set_power_management_limit(0, limit)
            assert gpus.get_power_management_limit(0) == limit
        else:
            with pytest.raises(ZeusGPUInvalidArgError, match=str(limit)):
                gpus.set_power_management_limit(0, limit)
            assert gpus.get_power_management_limit(0) == hi
    finally:
        for k in ("ZEUS_GPU_BACKEND", "ZEUS_SIM_GPUS", "ZEUS_SIM_CLOCK"):
            os.environ.pop(k, None)
        zeus.device.sim.reset()


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["busy", "idle", "run", "pl"]), st.floats(0, 30)),
        min_size=1,
        max_size=25,
    )
)
def test_property_counter_is_monotonic_and_matches_truth(steps):
    import os

    os.environ.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="A40", ZEUS_SIM_CLOCK="virtual")
    try:
        zeus.device.sim.reset()
        gpus = get_gpus()
        last = gpus.get_total_energy_consumption(0)
        for op, x in steps:
            if op == "busy":
                zeus.device.sim.set_busy(0, True)
            elif op == "idle":
                zeus.device.sim.set_busy(0, False)
            elif op == "run":
                zeus.device.sim.run(x / 10)
            else:
                gpus.set_power_management_limit(0, 100_000 + int(x * 6_000))
            zeus.device.sim.advance(x)
            now = gpus.get_total_energy_consumption(0)
            assert now >= last
            # The counter is the model's integral, truncated to whole mJ.
            assert abs(now - zeus.device.sim.true_energy(0) * 1000) < 1.0
            last = now
    finally:
        for k in ("ZEUS_GPU_BACKEND", "ZEUS_SIM_GPUS", "ZEUS_SIM_CLOCK"):
            os.environ.pop(k, None)
        zeus.device.sim.reset()
