"""GlobalPowerLimitOptimizer when a profiling window is too short to measure, or an epoch too
short to hold one: it measures again or says what to change, and never crashes."""

from __future__ import annotations

import csv
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import zeus
import zeus.device.sim
from zeus.monitor import ZeusMonitor
from zeus.optimizer.power_limit import Done, GlobalPowerLimitOptimizer

REPO = Path(__file__).resolve().parents[3]
COUNTER_PERIOD_S = 0.1  # the simulated boards publish energy every 100 ms at real fidelity


def optimizer_warnings(recwarn: pytest.WarningsRecorder, needle: str) -> list[str]:
    return [str(w.message) for w in recwarn if needle in str(w.message)]


def logged_windows(path: Path) -> list[tuple[str, float, float, float]]:
    """`(window, seconds, joules, bound)` of every window the monitor closed, in order."""
    with open(path, newline="") as f:
        return [
            (
                row["window_name"],
                float(row["elapsed_time"]),
                float(row["gpu0_energy"]),
                float(row["gpu0_energy_uncertainty"]),
            )
            for row in csv.DictReader(f)
        ]


def test_windows_shorter_than_the_counter_period_are_measured_again(
    sim_gpus: Callable[..., Any], tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    # An H100 whose counter moves every 100 ms, read directly on the virtual clock: a window
    # of four 2 ms steps reads 0 J (or one update's worth, with a bound larger than that).
    sim_gpus("H100", fidelity="real")
    curve = {int(pl): seconds for pl, seconds, _ in zeus.device.sim.workload_points(0)}
    work = 0.002 / curve[700]  # 2 ms steps at the maximum limit
    log = tmp_path / "windows.csv"
    monitor = ZeusMonitor(gpu_indices=[0], log_file=log)
    with GlobalPowerLimitOptimizer(
        monitor, wait_steps=0, warmup_steps=1, profile_steps=4, pl_step=100
    ) as plo:
        steps = 0
        while not isinstance(plo.state, Done):
            assert steps < 100_000, plo.state
            plo.on_step_begin()
            zeus.device.sim.run(work)
            plo.on_step_end()
            steps += 1

        [warning] = optimizer_warnings(recwarn, "[GlobalPowerLimitOptimizer] The profiling")
        assert "power limit 700 W is unreliable" in warning
        assert "profile_steps (now 4)" in warning and "0.1 s" in warning

        assert [m.power_limit for m in plo.measurements] == [700, 600, 500, 400, 300, 200]
        windows = logged_windows(log)
        # The first window was that short, and it was measured again.
        assert windows[0][0] == "__GlobalPowerLimitOptimizer_700"
        assert windows[0][1] < COUNTER_PERIOD_S and windows[0][2] == 0.0
        assert len(windows) > len(plo.measurements)
        for m in plo.measurements:
            kept = [w for w in windows if w[0] == f"__GlobalPowerLimitOptimizer_{m.power_limit}"]
            name, seconds, joules, bound = kept[-1]
            # What was recorded comes from a window the counter could measure ...
            assert seconds >= COUNTER_PERIOD_S and 0 < bound < joules, kept
            # ... scaled to profile_steps steps: 4 steps' time at this limit, same power.
            assert m.time == pytest.approx(4 * work * curve[m.power_limit], rel=1e-5)
            assert m.energy / m.time == pytest.approx(joules / seconds, rel=1e-5)
        assert plo.state.optimal_power_limit // 1000 in curve


def test_the_demo_runs_on_the_virtual_clock_without_a_trace(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_SIM_", "ZEUSD_"))}
    pkg_root = str(Path(zeus.__file__).resolve().parents[1])
    env.update(
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_CLOCK="virtual",  # and the simulator's default, calibrated fidelity
        ZEUS_STATE_DIR=str(tmp_path / "state"),
        PYTHONPATH=os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")])),
    )
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "power_limit_demo.py"), "--trace", "/none"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "ValidationError" not in out.stderr
    chosen = re.search(r"chosen power limit: (\d+) W", out.stdout)
    assert chosen is not None, out.stdout
    assert 100 <= int(chosen.group(1)) <= 300


def run_epochs(plo: GlobalPowerLimitOptimizer, epochs: int, steps_per_epoch: int) -> None:
    for _ in range(epochs):
        plo.on_epoch_begin()
        for _ in range(steps_per_epoch):
            plo.on_step_begin()
            zeus.device.sim.run(0.01)
            plo.on_step_end()
        plo.on_epoch_end()
        if isinstance(plo.state, Done):
            return


def test_epochs_too_short_for_the_defaults_say_once_what_fits(
    sim_gpus: Callable[..., Any],
    recwarn: pytest.WarningsRecorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim_gpus("A40")
    caplog.set_level(logging.INFO, logger="zeus")
    with GlobalPowerLimitOptimizer(ZeusMonitor(gpu_indices=[0])) as plo:
        run_epochs(plo, epochs=6, steps_per_epoch=30)
        assert plo.measurements == []  # every attempt was cut off
    [warning] = optimizer_warnings(recwarn, "too short to profile")
    assert "Epochs of 30 steps" in warning
    assert "51 steps within one epoch" in warning  # 10 warm-up + 40 measured + 1
    interrupted = [r for r in caplog.records if "interrupted by the end of the epoch" in r.message]
    assert len(interrupted) == 1  # then quiet: the warning said it all

    # The advice, taken as given, lets profiling finish in epochs of that length.
    advice = re.search(r"warmup_steps=(\d+), profile_steps=(\d+)", warning)
    assert advice is not None, warning
    warmup, profile = (int(x) for x in advice.groups())
    recwarn.clear()
    with GlobalPowerLimitOptimizer(
        ZeusMonitor(gpu_indices=[0]), warmup_steps=warmup, profile_steps=profile
    ) as plo:
        run_epochs(plo, epochs=40, steps_per_epoch=30)
        assert isinstance(plo.state, Done)
        assert len(plo.measurements) == len(plo.power_limits)
    assert optimizer_warnings(recwarn, "too short to profile") == []


def test_a_corrupt_profile_file_is_a_value_error_naming_it(
    sim_gpus: Callable[..., Any], tmp_path: Path
) -> None:
    sim_gpus("A40")
    path = tmp_path / "profile.json"
    path.write_text('{"measurements": [{"power_limit": 300, "energy": 0.0, "time": 1.0}]}')
    with pytest.raises(ValueError, match="not a power limit profile") as info:
        GlobalPowerLimitOptimizer(ZeusMonitor(gpu_indices=[0]), profile_path=path)
    assert str(path) in str(info.value) and "energy" in str(info.value)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a power limit profile"):
        GlobalPowerLimitOptimizer(ZeusMonitor(gpu_indices=[0]), profile_path=path)
