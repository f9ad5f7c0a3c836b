"""Drive our zeusd with Zeus 0.16's own client classes (run in a venv holding `zeus==0.16.0`).

Run by `test_zeus016_client.py`, never imported by pytest. Environment: `ZEUSD_SOCK_PATH` (the
daemon), `LD_LIBRARY_PATH` at our simulated `libnvidia-ml.so.1`, `ZEUS_SIM_GPUS` and
`ZEUS_SIM_SHARED` as the daemon's (the same simulated devices), `ZEUS_SIM_PRIVILEGED=0` (a direct
NVML write fails, so only the daemon can make a change).

Sets a power limit and locks GPU and memory clocks on every GPU, reads the limit back through
NVML, streams power for about 1 s, then prints `HOLDING <json>` while it still holds what it set
(the daemon restores a client's settings when it exits); waits for a line on stdin, resets the
clock locks, prints `RESULT <json>` and exits.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import sys
import threading
import time
from typing import Any, Callable

import pynvml

# Zeus's own warnings (a malformed SSE event, a failed SSE connection, an unexpected NVML error)
# are compatibility findings: collect them.
warnings_seen: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        warnings_seen.append(f"{record.name}: {record.getMessage()}")


logging.getLogger("zeus").addHandler(_Collect(level=logging.WARNING))

from zeus.device import get_gpus  # noqa: E402
from zeus.monitor.power_streaming import PowerStreamingClient  # noqa: E402
from zeus.utils.zeusd import ZeusdClient, ZeusdConfig  # noqa: E402


def attempt(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": fn()}
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}


def main() -> None:
    out: dict[str, Any] = {"zeus_version": importlib.metadata.version("zeus")}
    gpus = get_gpus()
    out["gpu_classes"] = [type(g).__name__ for g in gpus.gpus]
    out["names"] = [g.get_name() for g in gpus.gpus]
    per_gpu = []
    for i, gpu in enumerate(gpus.gpus):
        r: dict[str, Any] = {}
        lo, hi = gpus.get_power_management_limit_constraints(i)
        before = gpus.get_power_management_limit(i)
        target = (lo + (hi - lo) // 2) // 1000 * 1000
        if target == before:
            target = lo
        r.update(constraints=[lo, hi], before=before, target=target)
        # A direct NVML write fails in this unprivileged process: only the daemon can do it.
        r["direct_set"] = attempt(
            lambda gpu=gpu, target=target: pynvml.nvmlDeviceSetPowerManagementLimit(
                gpu.handle, target
            )
        )
        r["set"] = attempt(lambda i=i, target=target: gpus.set_power_management_limit(i, target))
        r["after"] = gpus.get_power_management_limit(i)  # NVML read of the shared device

        mems = sorted(gpus.get_supported_memory_clocks(i))
        gfx = sorted(gpus.get_supported_graphics_clocks(i, mems[-1]))
        r["mem_clocks"] = [mems[0], mems[-1]]
        r["gfx_clocks"] = [gfx[0], gfx[-1]]
        r["lock_gpu"] = attempt(lambda i=i, g=gfx[0]: gpus.set_gpu_locked_clocks(i, g, g))
        r["sm_clock_locked"] = attempt(
            lambda gpu=gpu: pynvml.nvmlDeviceGetClockInfo(gpu.handle, pynvml.NVML_CLOCK_SM)
        )
        r["lock_mem"] = attempt(lambda i=i, m=mems[0]: gpus.set_memory_locked_clocks(i, m, m))
        r["mem_clock_locked"] = attempt(
            lambda gpu=gpu: pynvml.nvmlDeviceGetClockInfo(gpu.handle, pynvml.NVML_CLOCK_MEM)
        )
        per_gpu.append(r)
    out["gpus"] = per_gpu

    client = ZeusdClient()  # from ZEUSD_SOCK_PATH
    out["daemon_gpu_ids"] = client.gpu_ids
    out["client_get_power_limit"] = {str(k): v for k, v in client.get_power_limit().items()}
    out["client_get_power"] = {str(k): v for k, v in client.get_gpu_power().power_mw.items()}

    # ~1 s of power through Zeus's SSE client.
    config = ZeusdConfig.from_env()
    assert config is not None
    stream = PowerStreamingClient(servers=[config])
    timer = threading.Timer(1.0, stream.stop)
    start = time.monotonic()
    timer.start()
    updates = 0
    seen: dict[str, list[float]] = {}
    for readings in stream:
        updates += 1
        for reading in readings.values():
            for gpu_id, watts in reading.gpu_power_w.items():
                seen.setdefault(str(gpu_id), []).append(watts)
        if time.monotonic() - start > 5:  # the timer failed to stop it
            stream.stop()
    timer.join()
    out["stream"] = {
        "updates": updates,
        "gpus": {k: {"n": len(v), "min_w": min(v), "max_w": max(v)} for k, v in seen.items()},
        "endpoints": sorted(stream.get_power()),
    }

    # The test checks the daemon while this process holds the limits and clock locks.
    print("HOLDING " + json.dumps(out), flush=True)
    sys.stdin.readline()
    for i, r in enumerate(per_gpu):
        r["reset_gpu"] = attempt(lambda i=i: gpus.reset_gpu_locked_clocks(i))
        r["reset_mem"] = attempt(lambda i=i: gpus.reset_memory_locked_clocks(i))
    out["warnings"] = warnings_seen
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
