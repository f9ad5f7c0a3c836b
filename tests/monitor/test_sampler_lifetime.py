"""Lifetime of the energy sampler thread: lazy start, stop with the last user, fork, exit."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import zeus.device.sim
from zeus.monitor import ZeusMonitor

# Linux truncates thread names to 15 characters.
THREAD = "zeus-sampler"


def sampler_threads() -> int:
    return sum(
        1 for t in Path("/proc/self/task").iterdir() if (t / "comm").read_text().strip() == THREAD
    )


@pytest.fixture
def h100(sim_gpus):
    return sim_gpus("H100,H100", clock="real", fidelity="real")


def _wait_for(predicate, seconds: float = 2.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_one_thread_for_all_monitors_started_lazily_and_stopped_with_the_last(h100):
    assert sampler_threads() == 0
    direct = ZeusMonitor(reads="direct")
    assert sampler_threads() == 0, "direct reads need no thread"
    a = ZeusMonitor(gpu_indices=[0], reads="cached")
    b = ZeusMonitor(gpu_indices=[0, 1], reads="cached")
    assert _wait_for(lambda: sampler_threads() == 1)
    time.sleep(0.1)
    assert sampler_threads() == 1, "one thread for both monitors"
    del a
    gc.collect()
    assert sampler_threads() == 1, "b still uses it"
    del b, direct
    gc.collect()
    assert _wait_for(lambda: sampler_threads() == 0)
    c = ZeusMonitor(reads="cached")
    assert _wait_for(lambda: sampler_threads() == 1), "a new user starts a new thread"
    del c
    gc.collect()
    assert _wait_for(lambda: sampler_threads() == 0)


def test_a_forked_child_measures_with_direct_reads_and_can_start_its_own_sampler(h100):
    warnings.simplefilter("ignore")
    monitor = ZeusMonitor(reads="cached")
    time.sleep(0.3)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no sampler thread came along
        code = 1
        try:
            os.close(r)
            monitor.begin_window("child", sync_cuda=False)
            zeus.device.sim.set_busy(0, True)
            time.sleep(0.5)
            m = monitor.end_window("child", sync_cuda=False)
            fresh = ZeusMonitor(reads="cached")
            # The new thread names itself once it runs: wait for that.
            started = _wait_for(lambda: sampler_threads() == 1)
            ok = m.energy[0] > 100.0 and started and fresh._reads_cached[0]
            os.write(w, f"{m.energy[0]:.1f} {sampler_threads()}".encode())
            code = 0 if ok else 3
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    report = os.read(r, 100).decode()
    assert os.waitstatus_to_exitcode(status) == 0, report
    # The parent's sampler goes on.
    monitor.begin_window("parent", sync_cuda=False)
    time.sleep(0.2)
    assert monitor.end_window("parent", sync_cuda=False).energy[0] > 0


def test_a_process_that_never_drops_its_monitor_exits_promptly():
    code = (
        "import os, time\n"
        "os.environ.update(ZEUS_GPU_BACKEND='sim', ZEUS_SIM_GPUS='H100')\n"
        "from zeus.monitor import ZeusMonitor\n"
        "m = ZeusMonitor(reads='cached')\n"
        "m.begin_window('open-at-exit', sync_cuda=False)\n"
        "time.sleep(0.3)\n"
        "print('done', flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_")}
    t = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"
    assert time.monotonic() - t < 30


def test_temperature_monitor_rides_the_shared_sampler(sim_gpus):
    from zeus.monitor import TemperatureMonitor

    sim_gpus("H100,A40", clock="real", fidelity="ideal")
    zeus.device.sim.set_busy(0)
    assert sampler_threads() == 0
    with TemperatureMonitor(update_period=0.05, max_samples_per_gpu=5) as tm:
        energy = ZeusMonitor(reads="cached")
        assert _wait_for(lambda: sampler_threads() == 1)
        time.sleep(0.4)
        assert sampler_threads() == 1, "one thread serves both monitors"
        timeline = tm.get_temperature_timeline()
        assert set(timeline) == {0, 1}
        assert all(len(points) == 5 for points in timeline.values()), timeline
        latest = tm.get_temperature()
        assert latest is not None and latest[0] > latest[1] >= 30, latest
        assert tm.get_temperature_timeline(gpu_index=1, start_time=time.time() + 10) == {1: []}
        with pytest.raises(ValueError, match="GPU 4 is not monitored"):
            tm.get_temperature_timeline(gpu_index=4)
        del energy
    gc.collect()
    assert _wait_for(lambda: sampler_threads() == 0), "stopped with its last user"
    assert len(tm.get_temperature_timeline()[0]) == 5, "samples stay readable"
    sim_gpus("A40", clock="virtual")
    with pytest.raises(ValueError, match="real clock"):
        TemperatureMonitor()
