"""The power-limit optimizer, its HF callback and Perseus's FrequencyController on a simulated
AMD Instinct MI300X (power cap 200-750 W, 750 W by default; graphics clock 500-2100 MHz,
memory clock 1300 MHz).

The board has two faces here:

- in process (`ZEUS_GPU_BACKEND=sim ZEUS_SIM_GPUS=MI300X`), on the virtual clock, where a step's
  time and energy follow the board's default workload curve exactly (`zeus.device.sim.run`);
- the simulated `libamd_smi.so` behind zeus's AMD backend (`ZEUS_GPU_BACKEND=amd`,
  `ZEUS_AMDSMI_LIB`), on the real clock. The library builds its boards once per process, from
  the environment of its first `amdsmi_init`, so it only ever runs in child processes.

Restore paths that end a process put the board in a state file (`ZEUS_SIM_SHARED`) that every
process naming it shares, as processes share a real GPU: the test process opens the same board
in process (both faces read and write the same file) and checks what the child left on it, and
a later process of the child's face finds what a killed one left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
import zeus
import zeus.device.sim
from childproc import finish
from plo_helpers import WindowMonitor
from zeus import _core
from zeus.optimizer.perseus.frequency_controller import FrequencyController
from zeus.optimizer.power_limit import (
    Done,
    GlobalPowerLimitOptimizer,
    MaxSlowdownConstraint,
    OptimumSelector,
    Time,
    ZeusCost,
)

MI300X = "AMD Instinct MI300X (Simulated)"
MIN_MW, MAX_MW = 200_000, 750_000  # the MI300X's cap range; the maximum is its default
# Every fifth point of the default curve (750, 687.5, ..., 250 W): each profiled limit is one.
PL_STEP = 125
LIMITS = [750, 625, 500, 375, 250]
WORK_PER_STEP = 1e-3  # units of work (one unit: one `time_per_epoch` of the curve)


def amd_lib() -> Path:
    """The simulated `libamd_smi.so` shipped in the package; skips the test when absent."""
    try:
        return zeus.device.sim.amdsmi_library_path()
    except FileNotFoundError as e:
        pytest.skip(f"the simulated libamd_smi.so is not built into the package: {e}")


def curve_power(points: list[tuple[float, float, float]], limit_w: int) -> float:
    """The busy power of the curve at a profiled limit: a board draws at most its cap."""
    by_pl = {int(p): a for p, _, a in points}
    return min(by_pl[limit_w], float(limit_w))


def expected(points: list[tuple[float, float, float]], selector: str) -> int:
    """The selector applied to the curve at `LIMITS`, highest first, in plain Python."""
    by_pl = {int(p): (t, a) for p, t, a in points}
    prof = [(pl, by_pl[pl][0] * min(by_pl[pl][1], pl), by_pl[pl][0]) for pl in LIMITS]
    if selector.startswith("zeus"):
        eta = float(selector.split(":")[1])
        costs = [eta * e + (1 - eta) * LIMITS[0] * t for _, e, t in prof]
        return prof[costs.index(min(costs))][0]
    if selector == "time":
        times = [t for _, _, t in prof]
        return prof[times.index(min(times))][0]
    factor = float(selector.split(":")[1])
    return min(pl for pl, _, t in prof if t <= factor * prof[0][2])


def build(selector: str) -> OptimumSelector:
    if selector.startswith("zeus"):
        return ZeusCost(float(selector.split(":")[1]))
    if selector == "time":
        return Time()
    return MaxSlowdownConstraint(float(selector.split(":")[1]))


# In process, on the virtual clock.


@pytest.mark.parametrize(
    ("selector", "choice"),
    [
        ("zeus:0.5", 500),
        ("zeus:1.0", 500),
        ("time", 750),
        ("slowdown:1.02", 625),
        ("slowdown:1.5", 375),
    ],
)
def test_mi300x_chooses_the_curves_optimum(
    selector: str,
    choice: int,
    sim_gpus: Callable[..., Any],
    set_calls: list[tuple[int, int]],
) -> None:
    gpus = sim_gpus("MI300X")
    assert gpus.get_name(0) == MI300X
    assert gpus.get_power_management_limit_constraints(0) == (MIN_MW, MAX_MW)
    assert gpus.get_power_management_limit(0) == MAX_MW
    points = zeus.device.sim.workload_points(0)
    assert {int(p) for p, _, _ in points} >= set(LIMITS)
    # The plain-Python selection on the curve, and the table above, agree.
    assert expected(points, selector) == choice

    monitor = WindowMonitor(gpus, [0])
    plo = GlobalPowerLimitOptimizer(
        monitor, build(selector), wait_steps=1, warmup_steps=3, profile_steps=8, pl_step=PL_STEP
    )
    assert plo.power_limits == [pl * 1000 for pl in LIMITS]
    epoch = 0
    while not isinstance(plo.state, Done):
        assert epoch < 200, plo.state
        # Epochs of 5, 9, 13, ... steps: some end inside a warmup or a measurement.
        plo.on_epoch_begin()
        for _ in range(5 + 4 * (epoch % 5)):
            plo.on_step_begin()
            zeus.device.sim.run(WORK_PER_STEP)
            plo.on_step_end()
            if isinstance(plo.state, Done):
                break
        plo.on_epoch_end()
        epoch += 1

    assert plo.state.optimal_power_limit == choice * 1000
    assert gpus.get_power_management_limit(0) == choice * 1000
    # Every limit was measured once, in order, over 8 steps at the curve's speed and power.
    assert [m.power_limit for m in plo.measurements] == LIMITS
    by_pl = {int(p): t for p, t, _ in points}
    for m in plo.measurements:
        seconds = 8 * WORK_PER_STEP * by_pl[m.power_limit]
        assert m.time == pytest.approx(seconds, rel=1e-4)
        assert m.energy == pytest.approx(seconds * curve_power(points, m.power_limit), rel=1e-3)
    # Every limit the optimizer set was inside the board's range, and the last is the choice.
    assert all(i == 0 and MIN_MW <= mw <= MAX_MW for i, mw in set_calls), set_calls
    assert set_calls[-1] == (0, choice * 1000)
    assert epoch > 1
    plo.close()
    assert gpus.get_power_management_limit(0) == MAX_MW


def test_mi300x_with_the_real_zeus_monitor(sim_gpus: Callable[..., Any], journal_dir: Path) -> None:
    """The same through `zeus.monitor.ZeusMonitor`: the MI300X's 15.3 µJ counter, read in Rust."""
    from zeus.monitor import ZeusMonitor

    gpus = sim_gpus("MI300X")
    points = zeus.device.sim.workload_points(0)
    plo = GlobalPowerLimitOptimizer(
        ZeusMonitor(gpu_indices=[0]),
        ZeusCost(0.5),
        wait_steps=1,
        warmup_steps=3,
        profile_steps=8,
        pl_step=PL_STEP,
    )
    # The original cap is journaled before the first change.
    [entry] = _core.settings.journal_entries(journal_dir)
    assert (entry["uuid"], entry["power_limit_mw"]) == (gpus.get_uuid(0), MAX_MW)
    for epoch in range(100):
        plo.on_epoch_begin()
        for _ in range(5 + 4 * (epoch % 5)):
            plo.on_step_begin()
            zeus.device.sim.run(WORK_PER_STEP)
            plo.on_step_end()
        plo.on_epoch_end()
        if isinstance(plo.state, Done):
            break
    assert isinstance(plo.state, Done)
    assert plo.state.optimal_power_limit == expected(points, "zeus:0.5") * 1000
    by_pl = {int(p): t for p, t, _ in points}
    for m in plo.measurements:
        seconds = 8 * WORK_PER_STEP * by_pl[m.power_limit]
        assert m.time == pytest.approx(seconds, rel=1e-4)
        # The counter ticks in 15.3 µJ: a few ticks off over several joules.
        assert m.energy == pytest.approx(seconds * curve_power(points, m.power_limit), rel=1e-3)
    plo.close()
    assert gpus.get_power_management_limit(0) == MAX_MW
    assert _core.settings.journal_entries(journal_dir) == []


def test_hf_callback_on_mi300x(
    tmp_path: Path, sim_gpus: Callable[..., Any], set_calls: list[tuple[int, int]]
) -> None:
    """`HFGlobalPowerLimitOptimizer` inside a real `transformers.Trainer` (CPU, a tiny model)."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    # The NVIDIA test's tiny Trainer run: a little work on the simulated board each step.
    from test_plo_hf import train_tiny

    gpus = sim_gpus("MI300X")
    points = zeus.device.sim.workload_points(0)
    plo = train_tiny(tmp_path, gpus, pl_step=250)
    assert isinstance(plo.state, Done)
    assert [m.power_limit for m in plo.measurements] == [750, 500, 250]
    # Energy alone: the curve's energy per unit of work is lowest at 500 W (506 J at 750 W,
    # 431 J at 500 W, 705 J at 250 W), and so was the measured energy.
    by_pl = {int(p): (t, a) for p, t, a in points}
    per_unit = {pl: by_pl[pl][0] * min(by_pl[pl][1], pl) for pl in (750, 500, 250)}
    assert min(per_unit, key=per_unit.__getitem__) == 500
    assert min(plo.measurements, key=lambda m: m.energy).power_limit == 500
    assert plo.state.optimal_power_limit == 500_000
    assert gpus.get_power_management_limit(0) == 500_000
    assert [mw for _, mw in set_calls][:3] == [750_000, 500_000, 250_000]
    assert json.loads((tmp_path / "profile.json").read_text())["measurements"]


def test_frequency_controller_locks_and_restores_mi300x_clocks(
    sim_gpus: Callable[..., Any], journal_dir: Path
) -> None:
    gpus = sim_gpus("MI300X")
    assert gpus.get_supported_memory_clocks(0) == [1300]
    graphics = gpus.get_supported_graphics_clocks(0, 1300)
    assert (max(graphics), min(graphics)) == (2100, 500)
    base = zeus.device.sim.steady_state(0)
    with FrequencyController(0, gpus) as c:
        assert c.frequency == c.max_frequency == 2100
        [entry] = _core.settings.journal_entries(journal_dir)
        assert entry["kind"] == "clocks" and entry["uuid"] == gpus.get_uuid(0)
        assert entry["gpu_clocks"] and entry["memory_clocks"]
        c.set_frequency(900)
        assert c.wait(timeout=10)
        assert c.frequency == 900
        slow = zeus.device.sim.steady_state(0)
        assert slow[0] > base[0] * 1.5 and slow[1] < base[1]
    assert zeus.device.sim.steady_state(0) == base
    assert _core.settings.journal_entries(journal_dir) == []


# Child processes.


def child_env(face: str, state_dir: Path, shared: Optional[Path], **extra: str) -> dict[str, str]:
    """A child's environment on one face of the MI300X, journaling into `state_dir`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ZEUS_", "ZEUSD_"))
        and k not in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
    }
    pkg_root = str(Path(zeus.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
    env.update(
        ZEUS_SIM_GPUS="MI300X",
        ZEUS_SIM_FIDELITY="ideal",
        ZEUS_STATE_DIR=str(state_dir),
    )
    if face == "amd":
        env.update(ZEUS_GPU_BACKEND="amd", ZEUS_AMDSMI_LIB=str(amd_lib()))
    else:
        env.update(ZEUS_GPU_BACKEND="sim")
    if shared is not None:
        env["ZEUS_SIM_SHARED"] = str(shared)
    env.update(extra)
    return env


def results(out: str) -> list[Any]:
    """Every JSON a child printed after `RESULT ` (zeus logs to stdout too)."""
    return [json.loads(x[len("RESULT ") :]) for x in out.splitlines() if x.startswith("RESULT ")]


def run_child(code: str, env: dict[str, str], timeout: float = 120) -> list[Any]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return results(proc.stdout)


# Busy work on either face: the board draws the workload's power at its cap.
BUSY = """
import ctypes, json, os, signal, sys, time
import zeus.device.sim
from zeus.device import get_gpus

gpus = get_gpus()
if gpus.backend == "amd":
    _lib = ctypes.CDLL(str(zeus.device.sim.amdsmi_library_path()))
    assert _lib.zeusSimAmdSetBusy(0, 1) == 0
else:
    zeus.device.sim.set_busy(0)

def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)

def step(seconds=0.05):
    # The step's work: the board runs busy for `seconds` of the real clock.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.002)
"""


@pytest.fixture
def amd_face_curve(sim_gpus: Callable[..., Any]) -> list[tuple[float, float, float]]:
    """The MI300X's default workload curve (the same preset behind both faces)."""
    sim_gpus("MI300X")
    return zeus.device.sim.workload_points(0)


def test_through_the_amdsmi_library(
    tmp_path: Path, amd_face_curve: list[tuple[float, float, float]]
) -> None:
    """zeus's AMD backend on the simulated `libamd_smi.so`: the optimizer profiles the busy
    board with `ZeusMonitor`, measures the curve's power at each cap, and settles."""
    code = (
        BUSY
        + """
from zeus.monitor import ZeusMonitor
from zeus.optimizer.power_limit import Done, GlobalPowerLimitOptimizer, ZeusCost

plo = GlobalPowerLimitOptimizer(
    ZeusMonitor(gpu_indices=[0]), ZeusCost(1.0),
    wait_steps=0, warmup_steps=1, profile_steps=3, pl_step=250,
)
limits = list(plo.power_limits)
steps = 0
while not isinstance(plo.state, Done) and steps < 200:
    plo.on_step_begin()
    step()
    steps += 1
report(
    backend=gpus.backend, name=gpus.get_name(0), limits=limits,
    optimal=getattr(plo.state, "optimal_power_limit", None),
    cap=gpus.get_power_management_limit(0),
    measurements=[(m.power_limit, m.energy, m.time) for m in plo.measurements],
)
"""
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env("amd", tmp_path / "state", None, ZEUS_SIM_FIDELITY="real"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [out] = results(proc.stdout)
    assert (out["backend"], out["name"]) == ("amd", MI300X)
    assert out["limits"] == [750_000, 500_000, 250_000]
    # AMD has no persistence mode: the optimizer says so and goes on.
    assert "Cannot enable persistence mode" in proc.stdout + proc.stderr
    assert "AMD GPUs have none" in proc.stdout + proc.stderr
    measured = out["measurements"]
    assert [pl for pl, _, _ in measured] == [750, 500, 250]
    # Each window's average power is the curve's busy power at that cap.
    for pl, energy, seconds in measured:
        assert energy / seconds == pytest.approx(curve_power(amd_face_curve, pl), rel=0.03)
    # Energy alone (eta 1): what the curve's power over these windows' lengths makes least.
    model = {pl: curve_power(amd_face_curve, pl) * seconds for pl, _, seconds in measured}
    choice = min(model, key=model.__getitem__)
    assert out["optimal"] == out["cap"] == choice * 1000
    assert MIN_MW <= out["optimal"] <= MAX_MW
    # The process restored the cap when it exited (nothing is journaled any more).
    assert _core.settings.journal_entries(tmp_path / "state") == []


def test_frequency_controller_on_the_amdsmi_library(tmp_path: Path) -> None:
    """AMD locks a range per clock domain (the performance level goes MANUAL) and unlocks both
    at once by going back to AUTO; the library's own record shows each step."""
    code = """
import ctypes, json, os
import zeus.device.sim
from zeus import _core
from zeus.device import get_gpus
from zeus.optimizer.perseus.frequency_controller import FrequencyController

gpus = get_gpus()
lib = ctypes.CDLL(str(zeus.device.sim.amdsmi_library_path()))

class ClkInfo(ctypes.Structure):
    _fields_ = [
        ("clk", ctypes.c_uint32), ("min_clk", ctypes.c_uint32), ("max_clk", ctypes.c_uint32),
        ("clk_locked", ctypes.c_uint8), ("clk_deep_sleep", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 2), ("reserved", ctypes.c_uint32 * 4),
    ]

def handles(call, *args):
    n = ctypes.c_uint32(0)
    assert call(*args, ctypes.byref(n), None) == 0
    out = (ctypes.c_void_p * n.value)()
    assert call(*args, ctypes.byref(n), out) == 0
    return [ctypes.c_void_p(h) for h in out]

[socket] = handles(lib.amdsmi_get_socket_handles)
[gpu] = handles(lib.amdsmi_get_processor_handles, socket)
GFX, MEM = 0, 4

def clocks():
    level = ctypes.c_uint32(99)
    assert lib.amdsmi_get_gpu_perf_level(gpu, ctypes.byref(level)) == 0
    out = {"level": level.value}
    for name, kind in (("gfx", GFX), ("mem", MEM)):
        info = ClkInfo()
        assert lib.amdsmi_get_clock_info(gpu, kind, ctypes.byref(info)) == 0
        out[name] = [info.min_clk, info.max_clk, info.clk_locked]
    return out

seen = {"before": clocks()}
c = FrequencyController(0)
seen["max"] = clocks()
c.set_frequency(900)
assert c.wait(timeout=10)
seen["900"] = clocks()
seen["frequency"] = c.frequency
seen["journal"] = [
    [e["kind"], e["gpu_clocks"], e["memory_clocks"]]
    for e in _core.settings.journal_entries(os.environ["ZEUS_STATE_DIR"])
]
c.end()
seen["after"] = clocks()
print("RESULT " + json.dumps(seen), flush=True)
"""
    [seen] = run_child(code, child_env("amd", tmp_path / "state", None))
    auto, manual = 0, 3  # AMDSMI_DEV_PERF_LEVEL_AUTO, _MANUAL
    board = {"level": auto, "gfx": [500, 2100, 0], "mem": [1300, 1300, 0]}
    assert seen["before"] == board
    assert seen["max"] == {"level": manual, "gfx": [2100, 2100, 1], "mem": [1300, 1300, 1]}
    assert seen["900"] == {"level": manual, "gfx": [900, 900, 1], "mem": [1300, 1300, 1]}
    assert seen["frequency"] == 900
    assert seen["journal"] == [["clocks", True, True]]
    # end(): back to AUTO, which reset both domains' ranges.
    assert seen["after"] == board
    assert _core.settings.journal_entries(tmp_path / "state") == []


# Restore when the optimizer's process ends: the board is shared with the test process.

# The optimizer profiles the busy board and settles at 250 W (the lowest cap no more than 100
# times slower: every cap here). It prints the cap when settled, and again from cleanups that
# run after zeus's restore (an exit hook registered before the optimizer, a SIGTERM cleanup
# registered after it). Then it waits on stdin: a newline (or its end) lets it exit normally.
HOLDER = (
    BUSY
    + """
import atexit
from zeus.monitor import ZeusMonitor
from zeus.optimizer.power_limit import Done, GlobalPowerLimitOptimizer, MaxSlowdownConstraint
from zeus.util import signals

def show(when):
    print("LIMIT", when, gpus.get_power_management_limit(0), flush=True)

atexit.register(show, "exit")
plo = GlobalPowerLimitOptimizer(
    ZeusMonitor(gpu_indices=[0]), MaxSlowdownConstraint(100.0),
    wait_steps=0, warmup_steps=0, profile_steps=2, pl_step=250,
)
signals.run_before(signal.SIGTERM, lambda: show("sigterm"))
while not isinstance(plo.state, Done):
    plo.on_step_begin()
    step()
show("done")
print("READY", os.getpid(), flush=True)
sys.stdin.readline()
"""
)

FACES = ["sim", "amd"]


@pytest.fixture
def shared_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_gpus: Callable[..., Any]
) -> Iterator[tuple[Path, Any]]:
    """A state file for the MI300X, and this process's view of the board in it."""
    path = tmp_path / "mi300x.state"
    monkeypatch.setenv("ZEUS_SIM_SHARED", str(path))
    gpus = sim_gpus("MI300X", clock="real")
    assert gpus.get_power_management_limit(0) == MAX_MW
    yield path, gpus
    zeus.device.sim.reset()


def start_holder(face: str, journal_dir: Path, shared: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(face, journal_dir, shared),
    )


def wait_ready(proc: subprocess.Popen[str]) -> tuple[int, list[str]]:
    """Read the holder's stdout up to `READY`: its pid and the lines read."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith("READY"):
            return int(line.split()[1]), lines
    proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"the holder ended early ({proc.returncode}): {lines}\n{err}")


def limits(lines: list[str]) -> list[tuple[str, int]]:
    """The `(when, mW)` of every cap the holder printed."""
    return [(x.split()[1], int(x.split()[2])) for x in lines if x.startswith("LIMIT")]


def holding(proc: subprocess.Popen[str], gpus: Any, journal_dir: Path) -> int:
    """Wait for the holder to settle; check the shared board and its journal entry. Its pid."""
    pid, lines = wait_ready(proc)
    assert limits(lines) == [("done", 250_000)]
    # The holder's cap is on the board this process sees ...
    assert gpus.get_power_management_limit(0) == 250_000
    # ... and the original is journaled in its name.
    [entry] = _core.settings.journal_entries(journal_dir)
    assert (entry["kind"], entry["uuid"]) == ("power_limit", gpus.get_uuid(0))
    assert (entry["power_limit_mw"], entry["pid"]) == (MAX_MW, pid)
    return pid


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    """Holder processes a test starts; any still running at its end is killed."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
        for stream in (p.stdin, p.stdout, p.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("ending", ["exit", "sigterm"])
def test_the_original_cap_comes_back_when_the_process_ends(
    face: str,
    ending: str,
    journal_dir: Path,
    shared_board: tuple[Path, Any],
    holders: list[subprocess.Popen[str]],
) -> None:
    path, gpus = shared_board
    proc = start_holder(face, journal_dir, path)
    holders.append(proc)
    holding(proc, gpus, journal_dir)
    assert proc.stdin is not None
    if ending == "exit":
        proc.stdin.close()
    else:
        proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    if ending == "exit":
        assert proc.returncode == 0, err
        assert limits(out.splitlines()) == [("exit", MAX_MW)]
    else:
        assert proc.returncode == -signal.SIGTERM, err
        assert limits(out.splitlines()) == [("sigterm", MAX_MW)]
    assert "Traceback" not in err, err
    assert gpus.get_power_management_limit(0) == MAX_MW
    assert _core.settings.journal_entries(journal_dir) == []


# The next optimizer's start, on the face of the killed one: its restore runs before it reads the
# cap it will restore itself, so the original it journals is 750 W, not the 250 W left behind.
NEXT_START = """
import json, os
from zeus import _core
from zeus.device import get_gpus
from zeus.optimizer import GlobalPowerLimitOptimizer

class Mon:
    gpu_indices = [0]
    def begin_window(self, key, sync_cuda=True): pass
    def end_window(self, key, sync_cuda=True, cancel=False): pass

gpus = get_gpus()
found = gpus.get_power_management_limit(0)
plo = GlobalPowerLimitOptimizer(Mon(), wait_steps=0, warmup_steps=5, profile_steps=5, pl_step=250)
plo.on_step_begin()  # Warmup at the maximum
entries = [
    [e["kind"], e["power_limit_mw"], e["pid"]]
    for e in _core.settings.journal_entries(os.environ["ZEUS_STATE_DIR"])
]
held = gpus.get_power_management_limit(0)
plo.close()
print("RESULT " + json.dumps({
    "pid": os.getpid(), "found": found, "held": held, "entries": entries,
    "closed": gpus.get_power_management_limit(0),
}), flush=True)
"""


@pytest.mark.parametrize("face", FACES)
def test_sigkill_leaves_a_journal_the_next_start_restores(
    face: str,
    journal_dir: Path,
    shared_board: tuple[Path, Any],
    holders: list[subprocess.Popen[str]],
) -> None:
    path, gpus = shared_board
    proc = start_holder(face, journal_dir, path)
    holders.append(proc)
    killed = holding(proc, gpus, journal_dir)
    proc.kill()
    out, _ = finish(proc)
    assert proc.returncode == -signal.SIGKILL
    assert limits(out.splitlines()) == []  # no cleanup ran
    # The killed run's cap stays on the board, and its entry in the journal.
    assert gpus.get_power_management_limit(0) == 250_000
    [entry] = _core.settings.journal_entries(journal_dir)
    assert (entry["power_limit_mw"], entry["pid"]) == (MAX_MW, killed)

    [nxt] = run_child(NEXT_START, child_env(face, journal_dir, path))
    assert nxt["found"] == 250_000
    # Restored first, then journaled again in the new run's name, with the real original.
    assert nxt["entries"] == [["power_limit", MAX_MW, nxt["pid"]]]
    assert nxt["held"] == nxt["closed"] == MAX_MW
    assert gpus.get_power_management_limit(0) == MAX_MW
    assert _core.settings.journal_entries(journal_dir) == []


# A killed controller's clocks on the shared board, then `python -m zeus.device restore`.
CLOCK_HOLDER = """
import os, sys
from zeus.optimizer.perseus.frequency_controller import FrequencyController
c = FrequencyController(0)
c.set_frequency(900)
assert c.wait(timeout=10)
print("READY", os.getpid(), flush=True)
sys.stdin.readline()
"""


def test_killed_frequency_controller_clocks_are_reset_by_a_later_process_on_amd(
    journal_dir: Path,
    shared_board: tuple[Path, Any],
    holders: list[subprocess.Popen[str]],
) -> None:
    """The later process's library never locked anything (its performance level is AUTO from
    the start); its reset to AUTO still unlocks the board the killed one locked."""
    path, gpus = shared_board
    zeus.device.sim.set_busy(0)
    base = zeus.device.sim.steady_state(0)
    env = child_env("amd", journal_dir, path)
    proc = subprocess.Popen(
        [sys.executable, "-c", CLOCK_HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    holders.append(proc)
    pid, _ = wait_ready(proc)
    locked = zeus.device.sim.steady_state(0)
    assert locked[0] > base[0] * 1.5 and locked[1] < base[1]
    proc.kill()
    finish(proc)
    assert zeus.device.sim.steady_state(0) == locked
    [entry] = _core.settings.journal_entries(journal_dir)
    assert (entry["kind"], entry["pid"]) == ("clocks", pid)

    cli = subprocess.run(
        [sys.executable, "-m", "zeus.device", "restore"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert (
        f"GPU 0 ({gpus.get_uuid(0)}): unlocked GPU and memory clocks (journaled by process {pid})"
    ) in cli.stdout
    assert zeus.device.sim.steady_state(0) == base
    assert _core.settings.journal_entries(journal_dir) == []
