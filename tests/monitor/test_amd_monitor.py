"""ZeusMonitor, PowerMonitor, the exporter and zeusd on simulated AMD GPUs.

Two faces of the same simulated boards (`crates/zeus-core/src/device/sim`):

- in process: `ZEUS_GPU_BACKEND=sim`, driven with `zeus.device.sim`;
- through the simulated C library `libamd_smi.so`: `ZEUS_GPU_BACKEND=amd` and
  `ZEUS_AMDSMI_LIB`, driven through the library's own `zeusSimAmd*` functions (ctypes on the
  same path returns the library zeus already loaded; `docs/simulated-amdsmi.md`).

The GPUs, the simulator's configuration and the library are per process, so every scenario runs
in a fresh interpreter with a clean environment and prints its figures as JSON; the assertions
are made here. Everything runs on the real clock at real fidelity, as on a real machine: the
boards update their power and counter every millisecond.

The truth of a window: the model's exact energy (`true_energy`, `zeusSimAmdTrueEnergy`) read
just before and just after each `begin_window` and `end_window` call, with no load change
between the two reads, and interpolated to the instant the monitor recorded (the model's power
is constant between them). A preempted child therefore costs the truth nothing. An MI250X is two
dies, two GPUs: the even die reports the package's power and energy and the odd die 0, so the
even die's truth is the sum of both dies' and the odd die's is 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from childproc import finish, run_python, stop
from zeusd_daemon import wait_answering

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO / "python"
BIN_DIR = PYTHON_DIR / "zeus" / "_bin"
EXPORTER = BIN_DIR / "zeus-monitor"
BUNDLED_ZEUSD = BIN_DIR / "zeusd"

OVERLAP_MESSAGE = "overlapping amdsmi calls"

# The acceptance rule: a window's GPU energy within 1% of the truth from 1 s on, 3% below.
LONG_S, LONG_RULE, SHORT_RULE = 1.0, 0.01, 0.03
# The bound is a ~95% bound: about one window in twenty may miss it by design. A scenario has
# up to 24 (window, GPU) pairs; were each bound exactly 95%, two or more misses would happen in
# a third of the runs and one past 1.5x (2.9 sigma) in one run in twelve. So: at most 15% of
# the pairs past their bound (five or more of 24 happens in 0.7% of runs at 95%) and none past
# 2x (3.9 sigma: 0.2% of runs). A bound that is systematically low still fails.
BOUND_MISS_SHARE, BOUND_SLACK = 0.15, 2.0

# --- Environments and processes -----------------------------------------------------------------


@pytest.fixture
def amd_lib() -> Path:
    """Path of the simulated `libamd_smi.so` built with the package."""
    import zeus.device.sim

    try:
        return zeus.device.sim.amdsmi_library_path()
    except FileNotFoundError as e:
        pytest.fail(str(e))


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without GPU configuration, plus `extra`: the boards of each
    face at real fidelity, idle until a test makes them busy."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ZEUS_", "ZEUSD_"))
        and not k.endswith("_VISIBLE_DEVICES")
        and k != "ROCM_PATH"
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYTHON_DIR), env.get("PYTHONPATH")) if p)
    env.update(ZEUS_SIM_FIDELITY="real", ZEUS_SIM_LOAD="idle")
    env.update(extra)
    return env


def face_env(face: str, lib: Path, models: str, **extra: str) -> dict[str, str]:
    """The environment of a child that sees `models` through `face` (`sim` or `amd`)."""
    if face == "sim":
        return clean_env(
            ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS=models, ZEUS_SIM_CLOCK="real", **extra
        )
    return clean_env(
        ZEUS_GPU_BACKEND="amd", ZEUS_AMDSMI_LIB=str(lib), ZEUS_SIM_GPUS=models, **extra
    )


def wait_until(what: str, ready: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll `ready()` until it returns something true, and return that; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        got = ready()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@contextmanager
def running_exporter(env: dict[str, str], log: Path) -> Iterator[str]:
    """`zeus-monitor serve` on a free loopback port with `env`, its stderr in `log`; yields
    its `host:port`. It must stop cleanly on SIGTERM."""
    if not EXPORTER.is_file():
        pytest.skip(f"the bundled zeus-monitor is missing at {EXPORTER} (scripts/dev-build)")
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [str(EXPORTER), "serve", "--listen", "127.0.0.1:0", "--cpus", "none"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:

        def address() -> str | None:
            if proc.poll() is not None:
                pytest.fail(f"the exporter exited ({proc.returncode}):\n{log.read_text()}")
            m = re.search(r"http://(\S+)/metrics", log.read_text())
            return m.group(1) if m else None

        yield wait_until("the exporter's address", address)
        assert stop(proc) == 0, log.read_text()
    finally:
        stop(proc)


def zeusd_binary() -> Path:
    """The bundled zeusd, unless `ZEUSD_BIN` names another (or it is missing: then the suite's
    own search, which skips when there is none)."""
    if BUNDLED_ZEUSD.is_file() and not os.environ.get("ZEUSD_BIN"):
        return BUNDLED_ZEUSD
    from zeusd_daemon import zeusd_bin

    return zeusd_bin()


@contextmanager
def running_zeusd(env: dict[str, str], tmp_path: Path, log: Path) -> Iterator[httpx.Client]:
    """zeusd on a unix socket as the current user, serving GPU reads only (gpu-control needs
    root on the AMD backend), its output in `log`; yields a client of its API."""
    sock = tmp_path / "zeusd.sock"
    args = [str(zeusd_binary()), "serve", "--mode", "uds", "--socket-path", str(sock)]
    args += ["--state-dir", str(tmp_path / "zeusd-state"), "--enable", "gpu-read"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    http = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://zeusd", timeout=10
    )
    try:
        wait_answering(proc, http, log.read_text, 30)
        yield http
    finally:
        http.close()
        stop(proc)


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()


def sample(body: str, metric: str, gpu: str) -> float | None:
    """The value of `metric`'s series for GPU `gpu` in an exposition `body`, if there is one."""
    m = re.search(rf'^{metric}\{{gpu="{gpu}",[^}}]*\}} (\S+)$', body, re.M)
    return float(m.group(1)) if m else None


# --- The children's helpers ---------------------------------------------------------------------

# Every child: the warnings of the whole run, the face's truth and load, tightly timed truth
# reads, and a window whose load steps at its edges and inside it.
PRELUDE = """
import ctypes, json, os, sys, time, warnings

warnings.simplefilter("always")
_recorder = warnings.catch_warnings(record=True)
WARNED = _recorder.__enter__()
_told = [0]

def fresh_warnings():
    # The warnings since the last call, as text.
    out = [str(w.message) for w in WARNED[_told[0]:]]
    _told[0] = len(WARNED)
    return out

if os.environ["ZEUS_GPU_BACKEND"] == "amd":
    LIB = ctypes.CDLL(os.environ["ZEUS_AMDSMI_LIB"])
    LIB.zeusSimAmdOverlaps.restype = ctypes.c_uint64

    def truth(i):
        x = ctypes.c_double()
        assert LIB.zeusSimAmdTrueEnergy(i, ctypes.byref(x)) == 0
        return x.value

    def busy(i, on):
        assert LIB.zeusSimAmdSetBusy(i, 1 if on else 0) == 0
else:
    import zeus.device.sim as sim

    def truth(i):
        return sim.true_energy(i)

    def busy(i, on):
        sim.set_busy(i, bool(on))

def load(on, dies):
    for i in dies:
        busy(i, i in on)

def stamp(dies):
    # (time, {die: true J}) from reads made within 0.2 ms of each other (the tightest of a few
    # tries on a busy machine), timed at their middle.
    best = None
    for _ in range(200):
        t0 = time.time()
        e = {i: truth(i) for i in dies}
        t1 = time.time()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, (t0 + t1) / 2, e)
        if t1 - t0 < 2e-4:
            break
    return best[1], best[2]

def truth_at(before, after, t):
    # The true energy at `t` between two stamps with no load change between them.
    (ta, ea), (tb, eb) = before, after
    f = (t - ta) / (tb - ta)
    return {i: ea[i] + f * (eb[i] - ea[i]) for i in ea}

def window(mon, name, seconds, plan, dies, gap=0.15):
    # `plan`: the load before the window (held `gap` s, so the edge steps from it), the
    # window's segments [(fraction of `seconds`, busy dies)], and the load right after it.
    # Returns the measurement and each die's true energy over the recorded window.
    pre, segments, post = plan
    load(pre, dies)
    time.sleep(gap)
    a = stamp(dies)
    mon.begin_window(name, sync_cuda=False)
    b = stamp(dies)
    start = mon.measurement_states[name].time
    for fraction, on in segments:
        load(on, dies)
        time.sleep(fraction * seconds)
    c = stamp(dies)
    m = mon.end_window(name, sync_cuda=False)
    d = stamp(dies)
    load(post, dies)
    e0, e1 = truth_at(a, b, start), truth_at(c, d, start + m.time)
    return m, {i: e1[i] - e0[i] for i in dies}

def figures(m, delta, truth_dies):
    # Per monitored GPU: the measurement against the sum of its dies' true energy.
    return {
        str(g): {
            "energy": m.gpu_energy[g],
            "bound": m.gpu_energy_uncertainty[g],
            "method": m.gpu_energy_provenance[g].method,
            "truth": sum(delta[i] for i in truth_dies[str(g)]),
            "time": m.time,
        }
        for g in m.gpu_energy
    }
"""

# Windows of the given lengths and load plans; prints the warnings at open and each window's
# figures with the warnings its end raised.
WINDOWS_RUN = """
from zeus.device import get_gpus
from zeus.monitor import ZeusMonitor

ARGS = json.loads(sys.argv[1])
get_gpus()
opened = fresh_warnings()
mon = ZeusMonitor(gpu_indices=ARGS["gpus"], reads=ARGS["reads"])
opened += fresh_warnings()
out = []
for k, (seconds, plan) in enumerate(ARGS["windows"]):
    m, delta = window(mon, f"w{k}", seconds, plan, ARGS["dies"])
    out.append({"gpus": figures(m, delta, ARGS["truth"]), "warnings": fresh_warnings()})
load([], ARGS["dies"])
print(json.dumps({"opened": opened, "windows": out}))
"""


def run_child(code: str, env: dict[str, str], args: Any = None, timeout: float = 120.0) -> Any:
    """`PRELUDE + code` in a fresh interpreter with `env` (and `args` as JSON in `argv[1]`);
    the JSON of its last line. Fails with its stderr if it exits non-zero."""
    if args is None:
        return run_python(PRELUDE + code, env, timeout)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PRELUDE + code), json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


# Load plans over an MI300X (die 0) and an MI250X (dies 1 and 2): (before, segments, after).
# A: the load rises at the start, falls inside, rises right after the end.
# B: it falls at the start, then steps twice inside, the package's dies apart; falls after.
# C: a different mix at each quarter, stepping at both edges.
PLAN_A = ([], [(0.6, [0, 1, 2]), (0.4, [])], [0, 1, 2])
PLAN_B = ([0, 1, 2], [(0.3, []), (0.4, [0, 1]), (0.3, [0, 2])], [])
PLAN_C = ([0], [(0.25, [1]), (0.25, [0, 1, 2]), (0.25, [2]), (0.25, [0])], [1])
# A few windows of each length, 0.2 s to 1.5 s (about 5 s of windows).
WINDOWS = [
    (0.2, PLAN_A),
    (0.2, PLAN_B),
    (0.2, PLAN_C),
    (0.5, PLAN_A),
    (0.5, PLAN_C),
    (1.0, PLAN_B),
    (1.0, PLAN_C),
    (1.5, PLAN_A),
]


def window_misses(windows: list[dict], gpus: list[str]) -> list[str]:
    """What in `windows` breaks the acceptance: a GPU with energy past the rule (1% from 1 s,
    else 3%), more than `BOUND_MISS_SHARE` of the pairs past their bound (at least one allowed)
    or one past `BOUND_SLACK` times it; a GPU with no true energy (an MI250X's odd die) that
    reports any beyond its bound."""
    misses, past_bound = [], []
    pairs = 0
    for k, w in enumerate(windows):
        for g in gpus:
            f = w["gpus"][g]
            err = abs(f["energy"] - f["truth"])
            where = f"window {k} GPU {g}: {f} (error {err:.3f} J)"
            if f["truth"] <= 0.0:
                if err > f["bound"] + 1e-9:
                    misses.append(f"{where}: energy on a die that draws none")
                continue
            pairs += 1
            rule = LONG_RULE if f["time"] >= LONG_S else SHORT_RULE
            if err > rule * f["truth"]:
                misses.append(f"{where}: {100 * err / f['truth']:.2f}% off, rule {rule:.0%}")
            if err > BOUND_SLACK * f["bound"]:
                misses.append(f"{where}: past {BOUND_SLACK}x its bound")
            elif err > f["bound"]:
                past_bound.append(where)
    if len(past_bound) > max(1, int(BOUND_MISS_SHARE * pairs)):
        misses += [f"{w}: past its bound" for w in past_bound]
    return misses


def error_table(windows: list[dict], gpus: list[str]) -> str:
    """One line per window and GPU: length, error %, error J, bound J, method."""
    rows = []
    for w in windows:
        for g in gpus:
            f = w["gpus"][g]
            err = f["energy"] - f["truth"]
            pct = 100 * err / f["truth"] if f["truth"] > 0 else 0.0
            rows.append(
                f"GPU {g} {f['time']:.2f} s {pct:+.3f}% {err:+.3f} J bound {f['bound']:.3f} J "
                f"{f['method']}"
            )
    return "\n".join(rows)


# --- 1. Windows under load steps on MI300X and MI250X -------------------------------------------


@pytest.mark.timeout(120)  # one child: half a second of counter check, 8 s of windows
@pytest.mark.parametrize(
    ("face", "reads"),
    [
        pytest.param("sim", "auto", id="in-process"),
        pytest.param("amd", "cached", id="amdsmi-cached"),
        pytest.param(
            "amd",
            "auto",
            id="amdsmi-auto",
        ),
    ],
)
def test_windows_under_load_steps_meet_the_rule_and_their_bounds(
    amd_lib: Path, face: str, reads: str
) -> None:
    """MI300X and MI250X, the load stepping at both edges and inside every window: each GPU's
    energy is within 1% of the truth from 1 s on and 3% below, and within its bound; the
    MI250X's odd die reports none (its package's energy is on the even die)."""
    r = run_child(
        WINDOWS_RUN,
        face_env(face, amd_lib, "MI300X,MI250X"),
        {
            "gpus": [0, 1, 2],
            "reads": reads,
            "dies": [0, 1, 2],
            "truth": {"0": [0], "1": [1, 2], "2": []},
            "windows": WINDOWS,
        },
    )
    windows = r["windows"]
    assert len(windows) == len(WINDOWS)
    print(error_table(windows, ["0", "1"]))
    # The odd die has no power to check its counter with: it is disabled, and said so.
    assert any("GPU 2" in w and "reports no power" in w for w in r["opened"]), r["opened"]
    for w in windows:
        assert w["gpus"]["2"]["method"] == "power_integration", w
        # Every window had busy stretches on both boards: the truth is not trivially small.
        assert w["gpus"]["0"]["truth"] > 40.0 and w["gpus"]["1"]["truth"] > 20.0, w
    misses = window_misses(windows, ["0", "1", "2"])
    assert not misses, "\n".join(misses)


# --- 2. The AMD counters' quirks ----------------------------------------------------------------

QUIRK_WINDOWS = [
    (0.3, PLAN_A),
    (0.5, PLAN_B),
    (1.0, PLAN_C),
    (0.2, PLAN_A),
    (1.0, PLAN_B),
    (0.5, PLAN_C),
]

# Each quirk: its switch, when its warning comes ("open": from GPUs.__init__; "window": at a
# window's end), the warning's key words, and the method of the windows after it.
QUIRKS: dict[str, tuple[dict[str, str], str, list[str], str | None]] = {
    "frozen": (
        {"ZEUS_SIM_COUNTER_FROZEN": "1"},
        "open",
        ["GPU 0", "energy counter disabled", "integrating power", "counted 0.000 J"],
        "power_integration",
    ),
    "backwards": (
        {"ZEUS_SIM_COUNTER_BACKWARDS": "1"},
        "window",
        ["GPU 0", "went backwards", "integrating its power readings"],
        "power_integration",
    ),
    "wrong-scale": (
        {"ZEUS_SIM_COUNTER_SCALE": "0.066"},
        "open",
        ["GPU 0", "energy counter disabled", "integrating power", "outside 0.1-10×"],
        "power_integration",
    ),
    "no-power": (
        {"ZEUS_SIM_INSTANT_POWER": "0"},
        "open",
        ["GPU 0", "reports no power", "derived from its energy counter"],
        None,
    ),
}


def quirk_params() -> list[Any]:
    return [
        pytest.param(face, quirk, id=f"{quirk}-{face}")
        for quirk in QUIRKS
        for face in ("sim", "amd")
    ]


@pytest.mark.timeout(120)  # one child: half a second of counter check, 5 s of windows
@pytest.mark.parametrize(("face", "quirk"), quirk_params())
def test_a_counter_quirk_warns_and_windows_stay_within_their_bounds(
    amd_lib: Path, face: str, quirk: str
) -> None:
    """An MI300X whose counter is frozen, goes backwards, counts 0.066x the energy, or that
    reports no power: the warning names the GPU and the fault, and windows stay within the
    rule and their bounds, by power integration once the fault is known."""
    switch, when, words, method = QUIRKS[quirk]
    r = run_child(
        WINDOWS_RUN,
        face_env(face, amd_lib, "MI300X", **switch),
        {
            "gpus": [0],
            "reads": "auto",
            "dies": [0],
            "truth": {"0": [0]},
            "windows": QUIRK_WINDOWS,
        },
    )
    windows = r["windows"]
    print(error_table(windows, ["0"]))
    if when == "open":
        warned = [w for w in r["opened"] if all(word in w for word in words)]
        assert warned, r["opened"]
        detected = 0  # every window comes after it
    else:
        assert not any("energy counter disabled" in w for w in r["opened"]), r["opened"]
        ended = [
            k
            for k, w in enumerate(windows)
            if any(all(x in m for x in words) for m in w["warnings"])
        ]
        # The sampler needs three backward steps within 60 s: the first or second window's end.
        assert ended and ended[0] <= 1, [w["warnings"] for w in windows]
        detected = ended[0] + 1
    if method is not None:
        after = [w["gpus"]["0"]["method"] for w in windows[detected:]]
        assert after and all(m == method for m in after), after
    misses = window_misses(windows, ["0"])
    assert not misses, "\n".join(misses)


# --- 3. PowerMonitor through the C library ------------------------------------------------------

# Four stretches of constant load, 0.6 s each; each GPU's samples within each (its first and
# last 50 ms left out) against the model's mean power there. The MI300X is sampled in its
# current (instant) power, the MI250X in its average power, the only reading each has.
POWER_RUN = """
import statistics
from zeus.device import get_gpus
from zeus.monitor import PowerMonitor

get_gpus()
instant = PowerMonitor(gpu_indices=[0])
average = PowerMonitor(gpu_indices=[1, 2], power_domains=["device_average"])
domains = [instant.power_domains, average.power_domains]
stretches = []
for name, on in (("idle", []), ("busy", [0, 1]), ("both", [0, 1, 2]), ("idle again", [])):
    load(on, [0, 1, 2])
    a = stamp([0, 1, 2])
    time.sleep(0.6)
    b = stamp([0, 1, 2])
    stretches.append((name, a, b))
load([], [0, 1, 2])
def samples(pm, g, a, b):
    got = pm.get_power_timeline(gpu_index=g, start_time=a + 0.05, end_time=b - 0.05)
    return [w for _, w in got[g]]
out = []
for name, (ta, ea), (tb, eb) in stretches:
    out.append({
        "name": name,
        "true_w": {"0": (eb[0] - ea[0]) / (tb - ta),
                   "1": (eb[1] - ea[1] + eb[2] - ea[2]) / (tb - ta)},
        "samples": {"0": samples(instant, 0, ta, tb), "1": samples(average, 1, ta, tb),
                    "2": samples(average, 2, ta, tb)},
    })
instant.stop()
average.stop()
print(json.dumps({"domains": domains, "stretches": out}))
"""


@pytest.mark.timeout(120)
def test_power_monitor_follows_current_and_average_power_through_amdsmi(amd_lib: Path) -> None:
    """The MI300X's current power and the MI250X's average power, sampled through the C
    library: each stretch's samples sit at the model's power (median within 2%, every sample
    within 4%), busy stretches apart from idle ones, and the odd die at 0 W."""
    import statistics

    r = run_child(POWER_RUN, face_env("amd", amd_lib, "MI300X,MI250X"))
    assert r["domains"] == [["device_instant"], ["device_average"]]
    by_name = {s["name"]: s for s in r["stretches"]}
    for s in r["stretches"]:
        for g in ("0", "1"):
            got, want = s["samples"][g], s["true_w"][g]
            # About one sample a millisecond: hundreds in 0.5 s, dozens on a starved machine.
            assert len(got) >= 20, (s["name"], g, len(got))
            assert statistics.median(got) == pytest.approx(want, rel=0.02), (s["name"], g, want)
            assert all(abs(w - want) <= 0.04 * want for w in got), (s["name"], g, want, got)
        assert s["samples"]["2"] and all(w == 0 for w in s["samples"]["2"]), s["samples"]["2"]
    for g in ("0", "1"):
        idle = by_name["idle"]["samples"][g] + by_name["idle again"]["samples"][g]
        busy = by_name["busy"]["samples"][g]
        assert min(busy) > 1.5 * max(idle), (g, min(busy), max(idle))
    # The MI250X's even die reports its package: its second die's load shows there.
    assert min(by_name["both"]["samples"]["1"]) > max(by_name["busy"]["samples"]["1"])


# --- 4. GPU and CPU windows -------------------------------------------------------------------

# One window on the MI300X, busy and then idle, with a simulated CPU package: the CPU truth is
# bracketed as in test_energy_cpu.py (published before each edge, true after it).
CPU_RUN = """
from zeus.monitor import ZeusMonitor

mon = ZeusMonitor(gpu_indices=[0], cpu_indices=[0])
load([], [0])
time.sleep(0.15)
a = stamp([0])
c0lo = sim.cpu_published_energy(0)
mon.begin_window("w", sync_cuda=False)
c0hi = sim.cpu_true_energy(0)
b = stamp([0])
start = mon.measurement_states["w"].time
load([0], [0])
time.sleep(0.9)
load([], [0])
time.sleep(0.6)
c = stamp([0])
c1lo = sim.cpu_published_energy(0)
m = mon.end_window("w", sync_cuda=False)
c1hi = sim.cpu_true_energy(0)
d = stamp([0])
gpu_truth = truth_at(c, d, start + m.time)[0] - truth_at(a, b, start)[0]
print(json.dumps({
    "gpu": figures(m, {0: gpu_truth}, {"0": [0]}),
    "cpu": m.cpu_energy, "dram": m.dram_energy, "total": m.total_energy,
    "cpu_bound": m.cpu_energy_uncertainty, "time": m.time,
    "cpu_lo": [c1lo[0] - c0hi[0], c1lo[1] - c0hi[1]],
    "cpu_hi": [c1hi[0] - c0lo[0], c1hi[1] - c0lo[1]],
}))
"""


@pytest.mark.timeout(120)
def test_a_window_has_gpu_and_cpu_energy_on_an_amd_machine(amd_lib: Path) -> None:
    """The in-process MI300X beside a simulated CPU package: one window has the GPU's energy
    (within 1% and its bound) and the package's and DRAM's (within their brackets, 1%)."""
    r = run_child(CPU_RUN, face_env("sim", amd_lib, "MI300X", ZEUS_SIM_CPUS="1"))
    assert not window_misses([{"gpus": r["gpu"]}], ["0"]), r
    cpu, dram = r["cpu"]["0"], r["dram"]["0"]
    (lo_c, lo_d), (hi_c, hi_d) = r["cpu_lo"], r["cpu_hi"]
    assert cpu > 0 and dram > 0, r
    assert lo_c * 0.99 <= cpu <= hi_c * 1.01, r
    assert lo_d * 0.99 <= dram <= hi_d * 1.01, r
    assert r["cpu_bound"]["0"] < 0.01 * cpu, r
    assert r["total"] == pytest.approx(r["gpu"]["0"]["energy"] + cpu + dram)


# --- 5. Thread safety ---------------------------------------------------------------------------

# Eight threads, each with its own ZeusMonitor over every GPU (half read through the sampler,
# half at the edges; the odd die is integrated by each monitor's PowerMonitor thread), doing
# short windows for 3 s while the load changes; then the library's count of overlapping calls.
THREADS_RUN = """
import random, threading
from zeus.device import get_gpus
from zeus.monitor import ZeusMonitor

warnings.simplefilter("ignore")
get_gpus()
LIB.zeusSimAmdResetOverlaps()
monitors = [ZeusMonitor(reads="cached" if k % 2 else "auto") for k in range(8)]
windows, errors = [0] * 8, []
go = threading.Barrier(9)

def work(k):
    rnd = random.Random(k)
    try:
        go.wait()
        while time.monotonic() < deadline:
            if k == 0:
                load([i for i in range(3) if rnd.random() < 0.5], [0, 1, 2])
            monitors[k].begin_window("w", sync_cuda=False)
            time.sleep(rnd.uniform(0.002, 0.02))
            m = monitors[k].end_window("w", sync_cuda=False)
            assert all(e >= 0 for e in m.gpu_energy.values()), m.gpu_energy
            windows[k] += 1
    except Exception as e:
        errors.append(f"thread {k}: {e!r}")

threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
for t in threads:
    t.start()
deadline = time.monotonic() + 3.0
go.wait()
print("GO", flush=True)
for t in threads:
    t.join()
load([], [0, 1, 2])
print(json.dumps({"overlaps": LIB.zeusSimAmdOverlaps(), "windows": windows, "errors": errors}))
"""


def thread_env(lib: Path, state: Path, **extra: str) -> dict[str, str]:
    """The thread-unsafe library, its boards shared through `state` by every process."""
    return face_env(
        "amd",
        lib,
        "MI300X,MI250X",
        ZEUS_SIM_AMDSMI_THREAD_UNSAFE="1",
        ZEUS_SIM_SHARED=str(state),
        **extra,
    )


@pytest.mark.timeout(180)  # the exporter, zeusd and a child with 8 monitors, 3 s of windows
def test_no_overlapping_amdsmi_calls_from_monitors_exporter_and_zeusd(
    amd_lib: Path, tmp_path: Path
) -> None:
    """With AMD SMI 26.0 (not thread-safe) in thread-unsafe mode: 8 threads of monitors in one
    process, the exporter scraped and zeusd asked for energy and power the whole time, and not
    one overlapping library call in any of the three; both served AMD data meanwhile."""
    env = thread_env(amd_lib, tmp_path / "sim.state")
    exporter_log, zeusd_log = tmp_path / "exporter.log", tmp_path / "zeusd.log"
    scrapes: list[dict[str, float | None]] = []
    energies: list[dict[str, Any]] = []
    exporter_env = dict(env, ZEUS_STATE_DIR=str(tmp_path / "state"))
    with (
        running_exporter(exporter_env, exporter_log) as addr,
        running_zeusd(env, tmp_path, zeusd_log) as zeusd,
    ):
        gpus = zeusd.get("/discover").json()["gpus"]
        assert [g["name"] for g in gpus[:2]] == [
            "AMD Instinct MI300X (Simulated)",
            "AMD Instinct MI250X (Simulated)",
        ], gpus
        child = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + THREADS_RUN],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            started = child.stdout.readline()
            assert started.strip() == "GO", started + finish(child)[1]
            while child.poll() is None:
                body = scrape(addr)
                assert 'vendor="amd"' in body, body
                scrapes.append(
                    {g: sample(body, "zeus_gpu_energy_joules_total", g) for g in ("0", "1")}
                )
                e = zeusd.get("/gpu/get_cumulative_energy", params={"gpu_ids": "0,1"})
                p = zeusd.get("/gpu/get_power")
                assert e.status_code == 200 and p.status_code == 200, (e.text, p.text)
                energies.append(e.json())
            out, err = finish(child, timeout=60)
        finally:
            stop(child)
        assert child.returncode == 0, err
    r = json.loads(out.strip().splitlines()[-1])
    print(f"windows per thread {r['windows']}, {len(scrapes)} scrapes, {len(energies)} zeusd reads")
    assert r["errors"] == [], r["errors"]
    assert all(n >= 10 for n in r["windows"]), r["windows"]
    assert r["overlaps"] == 0, r
    assert OVERLAP_MESSAGE not in err
    for log in (exporter_log, zeusd_log):
        text = log.read_text()
        assert OVERLAP_MESSAGE not in text, text
    # Both served fresh AMD data all along: many answers, the counters moving.
    assert len(scrapes) >= 10 and len(energies) >= 10, (len(scrapes), len(energies))
    for g in ("0", "1"):
        assert scrapes[0][g] is not None and scrapes[-1][g] is not None, scrapes
        assert scrapes[-1][g] > scrapes[0][g], scrapes
        assert energies[-1][g]["energy_mj"] > energies[0][g]["energy_mj"], energies


@pytest.mark.timeout(120)
def test_the_overlap_check_fails_where_zeus_does_not_serialize(
    amd_lib: Path, tmp_path: Path
) -> None:
    """The control: the same library reporting 26.2 (thread-safe), so zeus does not serialize
    its calls, in the same thread-unsafe mode: the 8 threads' calls overlap, and it says so."""
    env = thread_env(amd_lib, tmp_path / "sim.state", ZEUS_SIM_AMDSMI_VERSION="26.2.0")
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + THREADS_RUN.replace('print("GO", flush=True)', "")],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"windows per thread {r['windows']}, {r['overlaps']} overlapping calls")
    assert r["errors"] == [], r["errors"]
    assert r["overlaps"] > 0, r
    assert OVERLAP_MESSAGE in out.stderr


# --- 6. The exporter's AMD metrics -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_exporters_amd_metrics_pass_promtool(amd_lib: Path, tmp_path: Path) -> None:
    """`zeus-monitor serve` on an MI300X and an MI250X through the C library: the scrape passes
    `promtool check metrics`, and every GPU series says `vendor="amd"` and its model."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`; .ci/prometheus.sh)")
    env = face_env("amd", amd_lib, "MI300X,MI250X", ZEUS_STATE_DIR=str(tmp_path / "state"))
    with running_exporter(env, tmp_path / "exporter.log") as addr:

        def with_energy() -> str | None:
            body = scrape(addr)
            return body if "zeus_gpu_energy_joules_total{" in body else None

        body = wait_until("the exporter's GPU energy", with_energy)
    out = subprocess.run([promtool, "check", "metrics"], input=body.encode(), capture_output=True)
    assert out.returncode == 0, (out.stdout + out.stderr).decode()
    series = [line for line in body.splitlines() if line.startswith("zeus_gpu_")]
    assert series
    models = {"0": "MI300X", "1": "MI250X", "2": "MI250X"}
    for line in series:
        assert 'vendor="amd"' in line, line
        gpu = re.search(r'gpu="(\d+)"', line)
        assert gpu, line
        model = re.search(r'model="([^"]*)"', line)
        assert model and models[gpu.group(1)] in model.group(1), line
    assert sample(body, "zeus_gpu_energy_joules_total", "0") is not None
    assert sample(body, "zeus_gpu_power_watts", "0") is not None


def test_the_power_logger_logs_an_mi300x_which_has_no_average_power(
    amd_lib: Path, tmp_path: Path
) -> None:
    """`zeus-monitor OUT DURATION INTERVAL` logs NVML's GetPowerUsage in the reference's form;
    an MI300X has no average power, so its instant power is logged instead of failing."""
    out = tmp_path / "power.csv"
    env = face_env("amd", amd_lib, "MI300X", ZEUS_SIM_LOAD="busy")
    run = subprocess.run(
        [str(EXPORTER), str(out), "1", "100"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    rows = out.read_text().splitlines()
    assert rows[0] == "Time,Power", rows[:2]
    watts = [int(r.split(",")[1]) / 1000 for r in rows[1:]]
    assert len(watts) >= 5, rows
    # Busy at the default 750 W cap: well above the 140 W idle.
    assert all(300 < w <= 750 for w in watts), watts


def test_short_windows_are_judged_by_the_boards_own_update_period(amd_lib: Path) -> None:
    """AMD SMI does not say how often its counter updates; once the sampler has timed it (about
    a millisecond), a 30 ms window is not "shorter than the counter's update period" (it was,
    against NVIDIA's 100 ms default)."""
    code = """
import json, time, warnings
from zeus.monitor import ZeusMonitor
m = ZeusMonitor(gpu_indices=[0])
deadline = time.monotonic() + 30
while True:
    m.begin_window("calibrate")
    time.sleep(0.05)
    p = m.end_window("calibrate").gpu_energy_provenance[0]
    if p.update_period is not None and p.update_period < 0.01 or time.monotonic() > deadline:
        break
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m.begin_window("short")
    time.sleep(0.03)
    m.end_window("short")
print(json.dumps({"period": p.update_period, "warnings": [str(w.message) for w in caught]}))
"""
    res = run_python(code, face_env("amd", amd_lib, "MI300X", ZEUS_SIM_LOAD="busy"))
    assert res["period"] < 0.01, res
    assert not [w for w in res["warnings"] if "shorter than" in w], res
