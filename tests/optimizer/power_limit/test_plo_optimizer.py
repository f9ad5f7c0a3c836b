"""GlobalPowerLimitOptimizer on the simulated GPU: arguments, states, restore and the journal."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
import zeus
import zeus.device.sim
from childproc import default_sigint, finish, ignore_sigint
from plo_helpers import WindowMonitor
from zeus import _core
from zeus.device.__main__ import main as device_cli
from zeus.optimizer import GlobalPowerLimitOptimizer, HFGlobalPowerLimitOptimizer
from zeus.optimizer.power_limit import (
    Done,
    OptimumSelector,
    PowerLimitMeasurement,
    Profiling,
    Ready,
    Time,
    Warmup,
)
from zeus.optimizer.power_limit import optimizer as optimizer_module


def run_steps(plo: GlobalPowerLimitOptimizer, n: int, work: float = 0.01) -> None:
    for _ in range(n):
        plo.on_step_begin()
        zeus.device.sim.run(work)
        plo.on_step_end()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"wait_steps": -1}, "wait_steps.*-1"),
        ({"warmup_steps": -3}, "warmup_steps.*-3"),
        ({"profile_steps": 0}, "profile_steps.*0"),
        ({"pl_step": 0}, "pl_step.*0"),
        ({"pl_step": 2.5}, "pl_step.*2.5"),
        ({"optimum_selector": "Time"}, "optimum_selector.*Time"),
    ],
)
def test_bad_arguments_name_the_value(sim_gpus, kwargs: dict, needle: str) -> None:
    gpus = sim_gpus("A40")
    with pytest.raises(ValueError, match=needle):
        GlobalPowerLimitOptimizer(WindowMonitor(gpus, [0]), **kwargs)


def test_non_uniform_ranges_are_refused(sim_gpus) -> None:
    gpus = sim_gpus("A40,V100")
    with pytest.raises(ValueError, match="not uniform"):
        GlobalPowerLimitOptimizer(WindowMonitor(gpus, [0, 1]))


def test_no_permission_is_a_runtime_error_mentioning_sys_admin(sim_gpus, journal_dir) -> None:
    gpus = sim_gpus("A40", privileged=False)
    with pytest.raises(RuntimeError, match="SYS_ADMIN") as info:
        GlobalPowerLimitOptimizer(WindowMonitor(gpus, [0]))
    # The way out for an unprivileged job is named too: the daemon.
    assert "zeusd" in str(info.value) and "ZEUSD_SOCK_PATH" in str(info.value)
    assert _core.settings.journal_entries(journal_dir) == []


def test_behind_zeusd_the_daemons_reason_comes_first(sim_gpus) -> None:
    """A refusal by the daemon (a missing token) is not a privilege problem of the process."""
    from zeus.device.exception import ZeusGPUNoPermissionError
    from zeus.optimizer.power_limit.optimizer import _no_permission_message

    class BehindDaemon:
        zeusd = object()

    error = ZeusGPUNoPermissionError(
        "zeusd at /run/zeusd/zeusd.sock: POST /gpu/set_persistence_mode failed (HTTP 401): "
        "missing token (the daemon requires a token and ZEUSD_TOKEN is not set)"
    )
    message = _no_permission_message(BehindDaemon(), error)
    assert message.startswith("zeusd refused"), message
    assert "ZEUSD_TOKEN is not set" in message and "SYS_ADMIN" not in message


def test_limits_never_go_below_the_minimum(sim_gpus) -> None:
    gpus = sim_gpus("A40")  # 100..300 W
    plo = GlobalPowerLimitOptimizer(WindowMonitor(gpus, [0]), pl_step=30)
    assert plo.power_limits == [300_000, 270_000, 240_000, 210_000, 180_000, 150_000, 120_000]
    assert gpus.get_persistence_mode(0)
    plo.close()


def test_state_walk_with_zero_warmup(sim_gpus, set_calls) -> None:
    gpus = sim_gpus("A40,A40")
    zeus.device.sim.set_busy(0)
    mon = WindowMonitor(gpus, [0, 1])
    plo = GlobalPowerLimitOptimizer(
        mon, Time(), wait_steps=2, warmup_steps=0, profile_steps=3, pl_step=100
    )
    assert plo.power_limits == [300_000, 200_000, 100_000]
    assert plo.state == Ready(next_power_limit=300_000, steps=3)
    run_steps(plo, 2)
    assert plo.state == Ready(next_power_limit=300_000, steps=1)
    run_steps(plo, 1)  # the third step sets the limit and starts measuring at once
    assert plo.state == Profiling(current_power_limit=300_000, steps=3)
    run_steps(plo, 3)
    assert plo.state == Profiling(current_power_limit=200_000, steps=3)
    assert plo.current_power_limit == 200_000
    run_steps(plo, 6)
    assert isinstance(plo.state, Done)
    assert [m.power_limit for m in plo.measurements] == [300, 200, 100]
    assert [k for k, _, _ in mon.log] == [
        "__GlobalPowerLimitOptimizer_300",
        "__GlobalPowerLimitOptimizer_200",
        "__GlobalPowerLimitOptimizer_100",
    ]
    # Time() picks the fastest limit, the maximum; both GPUs always get the same limit.
    assert plo.state.optimal_power_limit == 300_000
    per_gpu = [[mw for i, mw in set_calls if i == g] for g in (0, 1)]
    assert per_gpu[0] == per_gpu[1] == [300_000, 200_000, 100_000, 300_000]


def test_warmup_then_profiling_then_interrupt(sim_gpus) -> None:
    gpus = sim_gpus("V100")
    plo = GlobalPowerLimitOptimizer(
        WindowMonitor(gpus, [0]), wait_steps=0, warmup_steps=2, profile_steps=2, pl_step=50
    )
    run_steps(plo, 1)
    assert plo.state == Warmup(current_power_limit=250_000, steps=2)
    run_steps(plo, 2)
    assert plo.state == Profiling(current_power_limit=250_000, steps=2)
    plo.on_epoch_end()
    assert plo.state == Ready(next_power_limit=250_000, steps=1)
    assert plo.monitor.windows == {}  # the window was cancelled


def test_done_rebinds_step_hook_to_a_noop(sim_gpus, tmp_path) -> None:
    gpus = sim_gpus("A40")
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps({"measurements": [{"power_limit": 300, "energy": 10.0, "time": 1.0}]})
    )
    plo = GlobalPowerLimitOptimizer(WindowMonitor(gpus, [0]), profile_path=path)
    assert plo.state == Done(optimal_power_limit=300_000)
    assert plo.on_step_begin is optimizer_module._noop
    plo.on_step_begin()
    plo.on_epoch_end()
    assert plo.state == Done(optimal_power_limit=300_000)


def test_custom_python_selector(sim_gpus) -> None:
    class Lowest(OptimumSelector):
        def select(self, measurements: list[PowerLimitMeasurement]) -> int:
            self.seen = [m.power_limit for m in measurements]
            return min(self.seen)

    gpus = sim_gpus("A40")
    sel = Lowest()
    plo = GlobalPowerLimitOptimizer(
        WindowMonitor(gpus, [0]), sel, wait_steps=0, warmup_steps=1, profile_steps=1, pl_step=100
    )
    run_steps(plo, 7)
    assert sel.seen == [300, 200, 100]
    assert plo.state == Done(optimal_power_limit=100_000)
    assert gpus.get_power_management_limit(0) == 100_000


def test_profile_is_written_atomically_in_reference_format(sim_gpus, tmp_path) -> None:
    gpus = sim_gpus("A40")
    zeus.device.sim.set_busy(0)
    path = tmp_path / "sub" / "profile.json"
    plo = GlobalPowerLimitOptimizer(
        WindowMonitor(gpus, [0]),
        wait_steps=0,
        warmup_steps=1,
        profile_steps=2,
        pl_step=100,
        profile_path=path,
    )
    run_steps(plo, 9)  # 1 (Ready) + 3 limits x (1 warmup + 2 measured), less the final step
    assert not path.exists()  # written only when profiling ends
    run_steps(plo, 1)
    assert isinstance(plo.state, Done)
    data = json.loads(path.read_text())
    assert [m["power_limit"] for m in data["measurements"]] == [300, 200, 100]
    assert all(set(m) == {"power_limit", "energy", "time"} for m in data["measurements"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["profile.json"]  # no temp left


def test_restore_on_close_and_on_exception(sim_gpus, journal_dir) -> None:
    gpus = sim_gpus("A40")
    uuid = gpus.get_uuid(0)
    gpus.set_power_management_limit(0, 220_000)
    with pytest.raises(KeyError), GlobalPowerLimitOptimizer(WindowMonitor(gpus, [0])) as plo:
        assert gpus.get_power_management_limit(0) == 300_000
        [entry] = _core.settings.journal_entries(journal_dir)
        assert entry["uuid"] == uuid
        assert entry["power_limit_mw"] == 220_000 and entry["pid"] == os.getpid()
        run_steps(plo, 3)
        raise KeyError("training crashed")
    assert gpus.get_power_management_limit(0) == 220_000
    assert _core.settings.journal_entries(journal_dir) == []


def test_hf_signature_matches() -> None:
    assert inspect.signature(HFGlobalPowerLimitOptimizer.__init__) == inspect.signature(
        GlobalPowerLimitOptimizer.__init__
    )


def test_importing_zeus_optimizer_is_light() -> None:
    code = (
        "import sys, zeus.optimizer, zeus.optimizer.power_limit;"
        "from zeus.optimizer import GlobalPowerLimitOptimizer;"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(None)
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# Child processes: the simulator's state is per process, so restore paths that end a process
# are observed from its output (it prints GPU 0's limit when ready, and again from cleanups
# that run after zeus's restore: an exit hook registered before zeus's, signal cleanups
# registered after it) and from the journal.

CHILD = """
import atexit, os, signal, sys, time
from zeus.device import get_gpus
from zeus.optimizer import GlobalPowerLimitOptimizer
from zeus.util import signals

class Mon:
    gpu_indices = [0]
    def begin_window(self, key, sync_cuda=True): pass
    def end_window(self, key, sync_cuda=True, cancel=False): pass

gpus = get_gpus()
def show(when):
    print("LIMIT", when, gpus.get_power_management_limit(0), flush=True)
gpus.set_power_management_limit(0, 250_000)   # the limit in force before the optimizer
atexit.register(show, "exit")
plo = GlobalPowerLimitOptimizer(Mon(), wait_steps=0, warmup_steps=5, profile_steps=5)
plo.on_step_begin()
signals.run_before(signal.SIGTERM, lambda: show("sigterm"))
signals.run_before(signal.SIGINT, lambda: show("sigint"))
show("ready")
"""
READY = "print('READY', os.getpid(), flush=True)\n"


def child_env(state_dir: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="A40", ZEUS_SIM_CLOCK="virtual")
    if state_dir is not None:
        env["ZEUS_STATE_DIR"] = str(state_dir)
    pkg_root = str(Path(zeus.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
    return env


def spawn(tail: str, state_dir: Path, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD) + textwrap.dedent(tail)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(state_dir),
        **popen,
    )


def wait_ready(proc: subprocess.Popen[str]) -> list[str]:
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith("READY"):
            return lines
    raise AssertionError(f"child ended early: {lines} {proc.stderr.read() if proc.stderr else ''}")


def limits(lines: list[str]) -> list[tuple[str, int]]:
    """The `(when, mW)` of every limit the child printed."""
    return [(x.split()[1], int(x.split()[2])) for x in lines if x.startswith("LIMIT")]


def sigterm_restores_and_clears_the_journal(proc: subprocess.Popen[str], journal_dir: Path) -> None:
    """SIGTERM a child holding the optimizer's limit: it restores 250 W and dies of SIGTERM."""
    assert len(_core.settings.journal_entries(journal_dir)) == 1
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc)
    assert proc.returncode == -signal.SIGTERM, err
    assert limits(out.splitlines()) == [("sigterm", 250_000)]
    assert _core.settings.journal_entries(journal_dir) == []


def test_sigterm_restores_then_dies_of_sigterm(journal_dir) -> None:
    proc = spawn(READY + "time.sleep(60)", journal_dir)
    lines = wait_ready(proc)
    assert limits(lines) == [("ready", 300_000)]
    sigterm_restores_and_clears_the_journal(proc, journal_dir)


def test_sigint_restores_and_raises_keyboard_interrupt(journal_dir) -> None:
    proc = spawn(
        "try:\n    " + READY + "    time.sleep(60)\nexcept KeyboardInterrupt:\n"
        "    print('KI', flush=True)\n",
        journal_dir,
        preexec_fn=default_sigint,
    )
    wait_ready(proc)
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    events = [x for x in out.splitlines() if x.startswith(("LIMIT", "KI"))]
    assert events == ["LIMIT sigint 250000", "KI", "LIMIT exit 250000"]
    assert _core.settings.journal_entries(journal_dir) == []


def test_an_ignored_sigint_leaves_the_limit_in_force(journal_dir) -> None:
    # Started like `nohup python train.py &`: SIGINT does not end the run, so the optimizer's
    # limit must stay; SIGTERM still ends it and restores.
    proc = spawn(
        READY + "sys.stdin.readline()\n"
        "print('LIMIT', gpus.get_power_management_limit(0), flush=True)\n"
        "time.sleep(60)\n",
        journal_dir,
        stdin=subprocess.PIPE,
        preexec_fn=ignore_sigint,
    )
    assert limits(wait_ready(proc)) == [("ready", 300_000)]
    proc.send_signal(signal.SIGINT)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().split() == ["LIMIT", "300000"]
    sigterm_restores_and_clears_the_journal(proc, journal_dir)


def test_uncaught_exception_restores_at_exit(journal_dir) -> None:
    proc = spawn(READY + "raise RuntimeError('boom')", journal_dir)
    wait_ready(proc)
    out, err = finish(proc)
    assert proc.returncode == 1 and "boom" in err
    assert limits(out.splitlines()) == [("exit", 250_000)]
    assert _core.settings.journal_entries(journal_dir) == []


def test_sigkill_leaves_a_journal_that_restore_applies(
    journal_dir: Path, sim_gpus: Callable[..., object], set_calls: list[tuple[int, int]]
) -> None:
    proc = spawn(READY + "time.sleep(60)", journal_dir)
    lines = wait_ready(proc)
    child_pid = int(lines[-1].split()[1])
    proc.kill()
    finish(proc)
    assert proc.returncode == -signal.SIGKILL

    gpus = sim_gpus("A40")
    uuid = gpus.get_uuid(0)  # the simulator's UUIDs are the same in every process
    [entry] = _core.settings.journal_entries(journal_dir)
    assert (entry["uuid"], entry["power_limit_mw"], entry["pid"]) == (uuid, 250_000, child_pid)
    # The CLI, in another process, reports and clears it ...
    cli = subprocess.run(
        [sys.executable, "-m", "zeus.device", "journal"],
        capture_output=True,
        text=True,
        env=child_env(journal_dir),
    )
    assert "250000 mW" in cli.stdout and "gone" in cli.stdout, cli.stderr
    # ... and here, in-process, it is applied to the GPU (which a killed run left at 300 W).
    assert gpus.get_power_management_limit(0) == 300_000
    assert device_cli(["restore"]) == 0
    assert gpus.get_power_management_limit(0) == 250_000
    assert _core.settings.journal_entries(journal_dir) == []


def test_new_optimizer_restores_a_killed_runs_journal(
    journal_dir: Path, sim_gpus: Callable[..., object], set_calls: list[tuple[int, int]]
) -> None:
    proc = spawn(READY + "time.sleep(60)", journal_dir)
    wait_ready(proc)
    proc.kill()
    finish(proc)
    gpus = sim_gpus("A40")
    plo = GlobalPowerLimitOptimizer(WindowMonitor(gpus, [0]))
    # The stale entry was applied (in Rust, so the spy sees only the optimizer's maximum) and
    # journaled again as this run's original.
    assert set_calls == [(0, 300_000)]
    [entry] = _core.settings.journal_entries(journal_dir)
    assert (entry["power_limit_mw"], entry["pid"]) == (250_000, os.getpid())
    plo.close()
    assert gpus.get_power_management_limit(0) == 250_000
    assert _core.settings.journal_entries(journal_dir) == []


def test_unwritable_journal_warns_and_still_restores(
    sim_gpus,
    tmp_path,
    monkeypatch,
    caplog,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("ZEUS_STATE_DIR", str(blocker / "state"))
    gpus = sim_gpus("A40")
    gpus.set_power_management_limit(0, 200_000)
    plo = GlobalPowerLimitOptimizer(WindowMonitor(gpus, [0]))
    assert gpus.get_power_management_limit(0) == 300_000
    assert "cannot journal GPU 0's original power limit" in caplog.text
    plo.close()
    assert gpus.get_power_management_limit(0) == 200_000


def test_cli_restore_in_a_fresh_process(journal_dir: Path) -> None:
    proc = spawn(READY + "time.sleep(60)", journal_dir)
    wait_ready(proc)
    proc.kill()
    finish(proc)
    assert len(_core.settings.journal_entries(journal_dir)) == 1
    cli = subprocess.run(
        [sys.executable, "-m", "zeus.device", "restore"],
        capture_output=True,
        text=True,
        env=child_env(journal_dir),
    )
    assert cli.returncode == 0, cli.stderr
    assert "GPU 0" in cli.stdout and "restored power limit 250000 mW" in cli.stdout
    assert _core.settings.journal_entries(journal_dir) == []
    again = subprocess.run(
        [sys.executable, "-m", "zeus.device", "restore"],
        capture_output=True,
        text=True,
        env=child_env(journal_dir),
    )
    assert "Nothing to restore" in again.stdout


def test_selector_returning_a_non_integer_is_a_type_error(sim_gpus, tmp_path) -> None:
    class Bad(OptimumSelector):
        def select(self, measurements: list[PowerLimitMeasurement]) -> int:
            return 250.5  # type: ignore[return-value]

    path = tmp_path / "p.json"
    path.write_text('{"measurements": [{"power_limit": 300, "energy": 1.0, "time": 1.0}]}')
    gpus = sim_gpus("A40")
    with pytest.raises(TypeError, match="250.5"):
        GlobalPowerLimitOptimizer(WindowMonitor(gpus, [0]), Bad(), profile_path=path)
