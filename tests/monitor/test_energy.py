"""ZeusMonitor on the simulated GPU (virtual clock): window rules, arithmetic, logs, warnings."""

from __future__ import annotations

import pickle
import sys
import types
import warnings
from pathlib import Path

import pytest
import zeus.device.sim
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zeus.monitor import Measurement, PowerMonitor, ZeusMonitor

# Counters are whole millijoules: each reading truncates by < 1 mJ.
COUNTER_TOL = 2e-3


def true_energies(n: int) -> list[float]:
    return [zeus.device.sim.true_energy(i) for i in range(n)]


def test_measurement_is_a_plain_value():
    m = Measurement(time=2.0, energy={0: 1.5, 3: 2.5})
    assert m.time == 2.0
    assert m.energy == {0: 1.5, 3: 2.5}
    assert m.total_energy == 4.0
    assert repr(m) == "Measurement(time=2.0, energy={0: 1.5, 3: 2.5})"
    assert m == Measurement(2.0, {0: 1.5, 3: 2.5})
    assert m != Measurement(2.0, {0: 1.5})
    assert m == m and not (m != m)
    assert m != "not a measurement"
    assert pickle.loads(pickle.dumps(m)) == m
    m.energy[0] = 10.0
    assert m.total_energy == 12.5


def test_window_key_rules(sim_gpus):
    sim_gpus("A40,V100")
    mon = ZeusMonitor()
    assert mon.gpu_indices == [0, 1]
    assert len(mon.gpus) == 2
    mon.begin_window("train")
    with pytest.raises(ValueError, match=r"^Measurement window 'train' already exists$"):
        mon.begin_window("train")
    with pytest.raises(ValueError, match=r"^Measurement window 'eval' does not exist$"):
        mon.end_window("eval")
    zeus.device.sim.advance(1.0)
    mon.end_window("train")
    with pytest.raises(ValueError, match="'train' does not exist"):
        mon.end_window("train")
    # A closed key can be reused.
    mon.begin_window("train")
    zeus.device.sim.advance(1.0)
    assert mon.end_window("train").time == pytest.approx(1.0)


def test_nested_and_overlapping_windows_over_several_gpus(sim_gpus):
    sim_gpus("A40,V100,A100")
    mon = ZeusMonitor()
    t = zeus.device.sim.now
    marks = {}

    def begin(k: str) -> None:
        mon.begin_window(k, sync_cuda=False)
        marks[k] = (t(), true_energies(3))

    def end(k: str) -> Measurement:
        m = mon.end_window(k, sync_cuda=False)
        t0, e0 = marks.pop(k)
        assert m.time == pytest.approx(t() - t0, abs=1e-6)
        e1 = true_energies(3)
        assert set(m.energy) == {0, 1, 2}
        for i in range(3):
            assert m.energy[i] == pytest.approx(e1[i] - e0[i], abs=COUNTER_TOL)
        return m

    begin("outer")
    zeus.device.sim.set_busy(0)
    zeus.device.sim.advance(2.0)
    begin("a")
    zeus.device.sim.set_busy(1)
    zeus.device.sim.advance(1.0)
    begin("b")  # overlaps a
    zeus.device.sim.advance(3.0)
    a = end("a")
    zeus.device.sim.set_busy(2)
    zeus.device.sim.advance(1.5)
    b = end("b")
    outer = end("outer")
    assert outer.time == pytest.approx(a.time + 2.0 + 1.5)
    assert b.time == pytest.approx(4.5)
    # A busy GPU draws more than an idle one over the same window.
    assert outer.energy[0] > outer.energy[2] > 0


# The reference's columns, then each energy's bound.
HEADER_1_0 = (
    "start_time,window_name,elapsed_time,gpu1_energy,gpu0_energy,"
    "gpu1_energy_uncertainty,gpu0_energy_uncertainty\n"
)


def test_cancel_returns_zeros_and_logs_nothing(sim_gpus, tmp_path: Path):
    sim_gpus("A40,V100")
    log = tmp_path / "log.csv"
    mon = ZeusMonitor(gpu_indices=[1, 0], log_file=log)
    mon.begin_window("x")
    zeus.device.sim.advance(5.0)
    m = mon.end_window("x", cancel=True)
    assert m == Measurement(time=0.0, energy={1: 0.0, 0: 0.0})
    assert log.read_text() == HEADER_1_0
    with pytest.raises(ValueError, match="does not exist"):
        mon.end_window("x")


def test_log_file_format_and_flush(sim_gpus, tmp_path: Path):
    sim_gpus("A40,V100")
    log = tmp_path / "deep" / "er" / "log.csv"
    mon = ZeusMonitor(gpu_indices=[1, 0], log_file=log)
    assert log.read_text() == HEADER_1_0
    mon.begin_window("outer")
    t_outer = zeus.device.sim.now()
    zeus.device.sim.advance(1.0)
    mon.begin_window("inner")
    t_inner = zeus.device.sim.now()
    zeus.device.sim.advance(0.5)
    inner = mon.end_window("inner")
    # Flushed per row: readable while the monitor is alive.
    rows = log.read_text().splitlines()
    assert len(rows) == 2

    def row(t: float, key: str, m: Measurement) -> str:
        b = m.gpu_energy_uncertainty
        return f"{t},{key},{m.time},{m.energy[1]},{m.energy[0]},{b[1]},{b[0]}"

    assert rows[1] == row(t_inner, "inner", inner)
    zeus.device.sim.advance(0.25)
    outer = mon.end_window("outer")
    rows = log.read_text().splitlines()
    assert rows[2] == row(t_outer, "outer", outer)
    fields = rows[2].split(",")
    assert float(fields[2]) == pytest.approx(1.75)


def test_pre_volta_p100_integrates_power_timeline(sim_gpus):
    """A P100 has no energy counter: energy comes from a power timeline, within 2%."""
    sim_gpus("P100,V100")
    mon = ZeusMonitor()
    assert mon._has_counter == [False, True]
    pm = mon.power_monitor
    assert isinstance(pm, PowerMonitor)
    assert pm.gpu_indices == [0]
    assert not pm.running  # virtual clock: sampling is driven by hand
    e0 = true_energies(2)
    mon.begin_window("train")
    step = 0.005
    for phase in range(6):
        busy = phase % 2 == 0
        zeus.device.sim.set_busy(0, busy)
        zeus.device.sim.set_busy(1, busy)
        for _ in range(int((0.7 + 0.3 * phase) / step)):
            zeus.device.sim.advance(step)
            pm.sample_now()
    m = mon.end_window("train")
    e1 = true_energies(2)
    want = [e1[i] - e0[i] for i in range(2)]
    assert m.energy[0] == pytest.approx(want[0], rel=0.02)
    assert m.energy[1] == pytest.approx(want[1], abs=COUNTER_TOL)
    assert want[0] > 100.0


def test_pre_volta_without_samples_falls_back_to_zero(sim_gpus):
    sim_gpus("P100")
    mon = ZeusMonitor()
    mon.begin_window("w")
    # The clock did not move: a single timeline point, no energy to integrate.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = mon.end_window("w")
    assert m.energy == {0: 0.0}


def test_approx_instant_energy_fills_windows_the_counter_missed(sim_gpus):
    sim_gpus("A40")
    mon = ZeusMonitor(approx_instant_energy=True)
    assert mon.approx_instant_energy
    mon.begin_window("tiny")
    zeus.device.sim.advance(1e-5)  # 0.3 mJ at 30 W idle: the mJ counter does not move
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = mon.end_window("tiny")
    assert m.energy[0] == pytest.approx(30.0 * 1e-5, rel=0.02)
    plain = ZeusMonitor()
    plain.begin_window("tiny")
    zeus.device.sim.advance(1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert plain.end_window("tiny").energy[0] == 0.0


def test_short_window_warns_once_per_key(sim_gpus):
    sim_gpus("A40")
    mon = ZeusMonitor()
    with pytest.warns(UserWarning, match=r"'step' lasted .* shorter than .* update period"):
        mon.begin_window("step")
        zeus.device.sim.advance(0.01)
        mon.end_window("step")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon.begin_window("step")
        zeus.device.sim.advance(0.01)
        mon.end_window("step")
        mon.begin_window("long")
        zeus.device.sim.advance(1.0)
        mon.end_window("long")
    with pytest.warns(UserWarning, match="'other'"):
        mon.begin_window("other")
        mon.end_window("other")


def test_counter_and_timeline_disagreement_is_reported(sim_gpus):
    sim_gpus("A40")
    pm = PowerMonitor(update_period=0.01, background=False)
    mon = ZeusMonitor(power_monitor=pm)
    # Agreement: the timeline is sampled densely.
    mon.begin_window("dense")
    pm.sample_now()
    zeus.device.sim.set_busy(0)
    for _ in range(200):
        zeus.device.sim.advance(0.01)
        pm.sample_now()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon.end_window("dense")
    # Disagreement: the timeline misses a long idle stretch inside a busy one.
    mon.begin_window("sparse")
    pm.sample_now()
    zeus.device.sim.set_busy(0, False)
    zeus.device.sim.advance(3.0)
    zeus.device.sim.set_busy(0, True)
    zeus.device.sim.advance(0.01)
    pm.sample_now()
    with pytest.warns(UserWarning, match=r"GPU 0's energy counter says .* power timeline"):
        mon.end_window("sparse")


def test_cuda_visible_devices_maps_framework_indices(sim_gpus, tmp_path: Path):
    # Simulated (physical) GPUs: 0 = A40, 1 = V100, 2 = P100. Visible: P100 then A40.
    gpus = sim_gpus("A40,V100,P100", visible="2,0")
    assert gpus.physical_indices == [2, 0]
    log = tmp_path / "log.csv"
    mon = ZeusMonitor(gpu_indices=[1], log_file=log)
    assert mon.power_monitor is None  # framework GPU 1 is the A40, which has a counter
    assert log.read_text().startswith(
        "start_time,window_name,elapsed_time,gpu1_energy,gpu1_energy_uncertainty\n"
    )
    zeus.device.sim.set_busy(0)  # physical A40
    e0 = zeus.device.sim.true_energy(0)
    mon.begin_window("w")
    zeus.device.sim.advance(2.0)
    m = mon.end_window("w")
    assert set(m.energy) == {1}
    assert m.energy[1] == pytest.approx(zeus.device.sim.true_energy(0) - e0, abs=COUNTER_TOL)
    all_visible = ZeusMonitor()
    assert all_visible.gpu_indices == [0, 1]
    assert all_visible._has_counter == [False, True]
    assert all_visible.power_monitor.gpu_indices == [0]


@pytest.mark.parametrize(
    ("indices", "match"),
    [
        ([], "must not be empty"),
        ([5], "GPU index 5 is out of range"),
        ([0, 0], r"gpu_indices=\[0, 0\]: device 0 appears twice"),
        ([-1], "-1 is not a device index"),
        (["0"], "'0' is not a device index"),
    ],
)
def test_bad_gpu_indices(sim_gpus, indices, match):
    sim_gpus("A40")
    with pytest.raises(ValueError, match=match):
        ZeusMonitor(gpu_indices=indices)


def _imported(monkeypatch, *names: str) -> None:
    """Make only `names` of the GPU frameworks look imported (as stand-in modules)."""
    for name in ("torch", "jax", "cupy"):
        if name in names:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        else:
            monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.fixture
def auto_syncs(monkeypatch) -> list[int]:
    """The GPUs an imported framework's sync is called for, in order (every framework sees a
    GPU: its `syncer` records the calls)."""
    from zeus.util import framework

    calls: list[int] = []
    monkeypatch.setattr(framework, "syncer", lambda name: calls.append)
    return calls


def test_sync_cuda_calls_framework_sync_per_gpu(sim_gpus, monkeypatch, auto_syncs):
    sim_gpus("A40,V100")
    calls = auto_syncs
    _imported(monkeypatch, "torch")
    mon = ZeusMonitor(gpu_indices=[1, 0])
    mon.begin_window("w")
    assert calls == [1, 0]
    zeus.device.sim.advance(1.0)
    mon.end_window("w", sync_cuda=False)
    assert calls == [1, 0]
    mon.begin_window("v", sync_cuda=False)
    zeus.device.sim.advance(1.0)
    mon.end_window("v")
    assert calls == [1, 0, 1, 0]


def test_sync_execution_is_zeus016s_name_of_sync_cuda(sim_gpus, monkeypatch, auto_syncs):
    sim_gpus("A40")
    calls = auto_syncs
    _imported(monkeypatch, "torch")
    mon = ZeusMonitor()
    mon.begin_window("w", sync_execution=False)
    zeus.device.sim.advance(1.0)
    mon.end_window("w", sync_execution=True)
    assert calls == [0]
    mon.begin_window("v", sync_cuda=False, sync_execution=False)  # agreeing is fine
    zeus.device.sim.advance(1.0)
    with pytest.raises(ValueError, match="sync_cuda=True and sync_execution=False disagree"):
        mon.end_window("v", sync_cuda=True, sync_execution=False)
    assert "v" in mon.measurement_states  # the refused call closed nothing
    mon.end_window("v", sync_execution=False)
    assert calls == [0]


def test_sync_execution_with_picks_the_framework(sim_gpus, monkeypatch):
    sim_gpus("A40,V100")
    from zeus.util import framework

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(framework, "syncer", lambda name: lambda i: calls.append((name, i)))
    _imported(monkeypatch)
    mon = ZeusMonitor(gpu_indices=[1], sync_execution_with="jax")
    mon.begin_window("w", sync_cuda=False)
    zeus.device.sim.advance(1.0)
    mon.end_window("w")  # JAX is not imported: nothing can be queued through it
    _imported(monkeypatch, "jax", "torch")
    mon.begin_window("w")
    assert calls == [("jax", 1)]
    with pytest.raises(ValueError, match="sync_execution_with='tensorflow'"):
        ZeusMonitor(sync_execution_with="tensorflow")  # type: ignore[arg-type]


def test_sync_imports_no_framework_and_finds_one_imported_later(sim_gpus, monkeypatch, auto_syncs):
    sim_gpus("A40")
    calls = auto_syncs
    _imported(monkeypatch)
    mon = ZeusMonitor()
    mon.begin_window("w")
    assert not any(name in sys.modules for name in ("torch", "jax", "cupy"))  # none imported
    assert calls == []
    _imported(monkeypatch, "torch")  # the program imports a framework after its first window
    zeus.device.sim.advance(1.0)
    mon.end_window("w")
    assert calls == [0]


def test_a_framework_without_a_gpu_syncs_nothing():
    from zeus.util import framework
    from zeus.util.framework import sync_execution, syncer

    if framework.sync_available():
        pytest.skip("a framework sees a GPU here")
    # No framework sees a GPU: none can have queued work.
    for name in ("torch", "jax", "cupy"):
        assert syncer(name) is None
        with pytest.raises(RuntimeError, match=f"sync_with='{name}'"):
            sync_execution([0], sync_with=name)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sync_with='mxnet'"):
        syncer("mxnet")


def test_measurement_states_show_open_windows(sim_gpus):
    sim_gpus("A40,P100")
    mon = ZeusMonitor()
    zeus.device.sim.advance(1.0)
    mon.begin_window("w")
    t, e = mon.measurement_states["w"]
    assert t == zeus.device.sim.now()
    assert set(e) == {0}  # only GPUs with a counter
    assert e[0] == pytest.approx(zeus.device.sim.true_energy(0), abs=COUNTER_TOL)
    zeus.device.sim.advance(1.0)
    mon.end_window("w")
    assert mon.measurement_states == {}


OPS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),
        st.booleans(),  # begin (True) or end
        st.floats(0.0, 2.0),  # time to advance first
        st.sampled_from([None, 0, 1]),  # GPU whose load to toggle first
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_any_interleaving_of_windows_matches_ground_truth(sim_gpus, ops):
    sim_gpus("A40,V100")
    mon = ZeusMonitor()
    model: dict[str, tuple[float, list[float]]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short windows warn; irrelevant here
        for key, begin, dt, toggle in ops:
            zeus.device.sim.advance(dt)
            if toggle is not None:
                zeus.device.sim.set_busy(toggle, not zeus.device.sim.is_busy(toggle))
            if begin:
                if key in model:
                    with pytest.raises(ValueError, match="already exists"):
                        mon.begin_window(key)
                else:
                    mon.begin_window(key)
                    model[key] = (zeus.device.sim.now(), true_energies(2))
            elif key not in model:
                with pytest.raises(ValueError, match="does not exist"):
                    mon.end_window(key)
            else:
                m = mon.end_window(key)
                t0, e0 = model.pop(key)
                assert m.time == pytest.approx(zeus.device.sim.now() - t0, abs=1e-6)
                e1 = true_energies(2)
                for i in range(2):
                    assert m.energy[i] == pytest.approx(e1[i] - e0[i], abs=COUNTER_TOL)
    assert set(mon.measurement_states) == set(model)


def test_pre_volta_on_the_real_clock_samples_in_the_background(sim_gpus):
    import time

    sim_gpus("P100", clock="real")
    mon = ZeusMonitor()
    assert mon.power_monitor.running
    zeus.device.sim.set_busy(0)
    e0 = zeus.device.sim.true_energy(0)
    mon.begin_window("w", sync_cuda=False)
    time.sleep(0.4)
    m = mon.end_window("w", sync_cuda=False)
    want = zeus.device.sim.true_energy(0) - e0
    assert m.energy[0] == pytest.approx(want, rel=0.05)
    assert mon.power_monitor.num_samples >= 10


def test_cut_slices_add_up_to_the_window_they_cut(sim_gpus):
    """`cut_window` ends a slice and starts the next from the same reads: nothing is lost or
    counted twice between slices, and the window stays open under its name."""
    sim_gpus("A40,V100")
    mon = ZeusMonitor(gpu_indices=[0, 1])
    mon.begin_window("whole")
    mon.begin_window("cut")  # the virtual clock has not moved: the same start
    slices = []
    for k in range(5):
        zeus.device.sim.set_busy(0, k % 2 == 0)
        zeus.device.sim.advance(0.7)
        slices.append(mon.cut_window("cut"))
    zeus.device.sim.advance(0.4)
    slices.append(mon.end_window("cut"))
    whole = mon.end_window("whole")
    assert sum(s.time for s in slices) == pytest.approx(whole.time)
    for i in (0, 1):
        assert sum(s.energy[i] for s in slices) == pytest.approx(whole.energy[i], rel=1e-9)
    assert slices[0].energy[0] > slices[1].energy[0]  # busy, then idle
    with pytest.raises(ValueError, match="'cut' does not exist"):
        mon.cut_window("cut")
