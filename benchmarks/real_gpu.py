"""Real-GPU checks of zeus's measurement paths and power-limit optimizer (NVIDIA GPU needed).

Run on a machine with an NVIDIA GPU, PyTorch with CUDA, nvidia-ml-py and zeus (here from a wheel
unpacked into /tmp/site):

    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 benchmarks/real_gpu.py [--quick]
        [--gpu N] [--only NAME]... [--skip NAME]...

stdout gets one JSON line per figure, flushed as soon as it is known (a timeout keeps what was
printed): `{"figure": NAME, ...values..., "unit": ...}`, or `{"figure": NAME, "error": "..."}`
when that figure failed (the others still run). Progress goes to stderr. The full run takes
about 4 minutes (at most ~8.5, then the remaining figures are skipped), `--quick` about 2.
The last line is always `{"figure": "restored", ...}`: the power limit is set back to the
default and locked clocks are reset (also on SIGTERM). Without NVML or the GPU the only line is
`{"figure": "environment", "error": ...}` and the exit status is 2.

The load is bf16 (fp16 where bf16 is unsupported) 8192x8192 matmuls. `environment` (printed
first) gives the GPU, versions, the time of one matmul and the matmuls in a ~50 ms step and a
~12.5 ms unit. "The counter" means `nvmlDeviceGetTotalEnergyConsumption`, read with pynvml
after a CUDA sync. It changes only once per update period (100 ms on an H100, where it also
shows an update ~15 ms late), so a read right after a sync ("naive") can miss up to ~115 ms of
energy. "Aligned" references therefore read it just as it changes (for an end edge: the first
change that covers the edge) and correct the few ms of slack with the instant power; both are
reported. Differences are `(x - reference) / reference` in percent.

Figures:
- nvml_read_cost: wall and thread-CPU time of one pynvml call, idle GPU: `energy_counter`,
  `power_usage` (nvmlDeviceGetPowerUsage), `power_instant` (field NVML_FI_DEV_POWER_INSTANT);
  each `{"calls", "wall_us": {median, p10, p90}, "cpu_us": {...}}`.
- update_period: under a background matmul load, each reading polled for 1.5 s; per reading
  `{"changes_per_s", "interval_ms": {median, p10, p90}, "polls"}`; `zeus_reported_period_s`
  (`GPUs.get_power_update_period`, None where unknown or missing) and
  `zeus_sampling_period_s` (`infer_counter_update_period`, PowerMonitor's default period).
- window_cost: one `begin_window` + `end_window` pair, idle GPU, per monitor mode
  (`direct`, `cached`: `ZeusMonitor(reads=...)`; `default` only when no mode is accepted) and
  `sync_false` / `sync_true`: `{"pairs", "wall_us", "cpu_us", "process_cpu_per_pair_us"}`
  (the last includes background threads), plus `background_cpu_pct`: the process's CPU share
  of an idle second (`baseline` before any monitor, then after creating each mode's monitor;
  the cached mode's sampler thread is process-wide, so later figures run with it).
- step_overhead: 60 steps of ~50 ms (matmuls + sync) with no window (`none`) and a window around
  each step per mode (segments in ABC..CBA order): `{"mean_ms", "median_ms", "std_ms",
  "overhead_pct", "overhead_median_pct"}` (vs `none`).
- window_vs_counter: 3 windows of ~2.4 s load, all modes nested over the same load (nesting
  order rotated), each vs the counter just outside them: `counter_j` (naive, as asked: read
  before begin_window and after end_window), `counter_aligned_j`; per mode `{"energy_j",
  "diff_pct", "mean_diff_pct", "max_abs_diff_pct"}` vs naive and the same with `_aligned`.
- power_monitor_domains: `PowerMonitor(power_domains=[d])` for d in device_instant,
  device_average, memory_average (`accepted`, `rejected`: construction raised); idle, 4 s load,
  idle; energy integrated by `get_energy(power_domain=d)` over exactly the load (`A`) and over
  the load with 1 s idle margins (`B`) vs the aligned counter (`counter_A_j`, `counter_B_j`)
  and vs naive reads (`counter_*_naive_j`); per domain `{A,B,A_naive,B_naive}_err_pct` (one per
  repetition) and `..._mean_err_pct`, plus `update_period_s`.
- short_window_spread: truth = aligned counter energy per ~12.5 ms unit of matmuls over 3 s
  runs (all but one before, one after; `truth_j_per_unit`, `truth_windows_j_per_unit`,
  `truth_spread_pct`, `truth_naive_windows_j_per_unit`); then one pass per mode over the same
  plan (seed 0) of 60 windows of 0.2-0.33 s (whole units) with random 0-0.2 s idle gaps before
  about half, each window wrapping exactly its units (sync_cuda=True): `direct`, `cached`,
  `cached_exact` (`end_window(exact=True)`); per mode `{"rel_std_pct", "worst_abs_dev_pct",
  "mean_bias_pct", "zero_windows", "n"}` of energy per unit vs truth.
- bounds_vs_error: per window length (0.2, 0.5, 1, 2 s; 10 windows each, 5 with --quick),
  windows of whole units with random idle gaps before half of them, `ZeusMonitor(reads=
  "cached")`: the bound each reports (`gpu_energy_uncertainty`) next to its observed error
  against the energy per unit of 3 s truth windows taken before and after:
  `{"median_bound_pct", "median_abs_err_pct", "mean_abs_err_pct", "covered_frac", "methods"}`
  (`methods`: how many windows each provenance made, i.e. the self-check's mode).
- plo_regret (root only): sweep of power limits from max to min in 50 W steps (100 W with
  --quick): per limit, after 1 s warm-up, 2 s of steps: `step_ms`, `step_j` (mean power from the
  slope of the counter's updates, polled by a thread, x step time; `step_j_naive` from two
  reads) and ZeusCost `cost` (eta 0.5, max power = max limit);
  then `GlobalPowerLimitOptimizer(ZeusCost(0.5, 1), warmup_steps=10, profile_steps=40)` on the
  same step: `chosen_w`, `sweep_best_w`, `regret_pct` ((sweep cost at chosen - min) / min).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import sys
import threading
import time
import warnings
from typing import Any, Callable

FIGURES = (
    "nvml_read_cost",
    "update_period",
    "window_cost",
    "step_overhead",
    "window_vs_counter",
    "power_monitor_domains",
    "short_window_spread",
    "bounds_vs_error",
    "plo_regret",
)
NEEDS_TORCH = set(FIGURES) - {"nvml_read_cost"}
MODES = ("direct", "cached")
DOMAINS = ("device_instant", "device_average", "memory_average")
T0 = time.monotonic()

PARAMS = {
    "full": {
        "read_calls": 200,
        "energy_calls": 200,
        "poll_s": 1.5,
        "pairs": 200,
        "pairs_direct": 100,
        "bg_cpu_s": 1.0,
        "steps": 60,
        "wvc_windows": 3,
        "wvc_s": 2.4,
        "pm_reps": 2,
        "pm_load_s": 4.0,
        "truth_windows": 3,
        "truth_s": 3.0,
        "short_windows": 60,
        "bound_lengths": (0.2, 0.5, 1.0, 2.0),
        "bound_windows": 10,
        "pl_step_w": 50,
        "sweep_warm_s": 1.0,
        "sweep_meas_s": 2.0,
        "budget_s": 510.0,
    },
    "quick": {
        "read_calls": 200,
        "energy_calls": 50,
        "poll_s": 1.5,
        "pairs": 100,
        "pairs_direct": 50,
        "bg_cpu_s": 0.5,
        "steps": 30,
        "wvc_windows": 2,
        "wvc_s": 2.0,
        "pm_reps": 1,
        "pm_load_s": 4.0,
        "truth_windows": 2,
        "truth_s": 2.0,
        "short_windows": 30,
        "bound_lengths": (0.2, 0.5, 1.0, 2.0),
        "bound_windows": 5,
        "pl_step_w": 100,
        "sweep_warm_s": 0.5,
        "sweep_meas_s": 1.5,
        "budget_s": 220.0,
    },
}


# ---- output -----------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if x is None or isinstance(x, (bool, int, str)):
        return x
    try:
        return _clean(float(x))
    except (TypeError, ValueError):
        return str(x)


# The JSON lines' stream. main() points sys.stdout at stderr, so that whatever else prints
# (zeus's loggers write to sys.stdout) does not mix with them.
_OUT = sys.stdout


def emit(figure: str, **values: Any) -> None:
    _OUT.write(json.dumps(_clean({"figure": figure, **values})) + "\n")
    _OUT.flush()


def _logs_to_stderr() -> None:
    """Move logging handlers that write to the JSON stream over to stderr."""
    import logging

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for lg in loggers:
        for hd in getattr(lg, "handlers", []):
            if isinstance(hd, logging.StreamHandler) and hd.stream is _OUT:
                hd.setStream(sys.stderr)


def err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def quantile(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]


def summary(xs: list[float], scale: float = 1.0) -> dict[str, Any]:
    if not xs:
        return {"median": None, "p10": None, "p90": None}
    return {k: quantile(xs, p) * scale for k, p in (("median", 0.5), ("p10", 0.1), ("p90", 0.9))}


def pct(x: float, ref: float) -> float | None:
    return (x - ref) / ref * 100.0 if ref else None


# ---- GPU helpers ------------------------------------------------------------------------------


class Work:
    """Three n x n matrices; `mm(k)` queues k matmuls (no sync)."""

    def __init__(self, torch: Any, device: Any, dtype: Any, n: int = 8192) -> None:
        self.torch = torch
        self.a = torch.randn(n, n, device=device, dtype=dtype)
        self.b = torch.randn(n, n, device=device, dtype=dtype)
        self.c = torch.empty(n, n, device=device, dtype=dtype)

    def mm(self, k: int) -> None:
        matmul, a, b, c = self.torch.matmul, self.a, self.b, self.c
        for _ in range(k):
            matmul(a, b, out=c)


class _Worker:
    """A daemon thread running `_run` for the span of a `with` block."""

    name = "worker"

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.stop = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self.ctx.threads.append(self)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


class BackgroundLoad(_Worker):
    """Matmuls on a thread and stream of their own until the `with` block ends."""

    name = "matmul-load"

    def __init__(self, ctx: Ctx) -> None:
        super().__init__(ctx)
        self.count = 0

    def _run(self) -> None:
        torch, ctx = self.ctx.torch, self.ctx
        try:
            torch.cuda.set_device(ctx.dev)
            stream = torch.cuda.Stream(device=ctx.dev)
            with torch.cuda.stream(stream):
                work = Work(torch, ctx.dev, ctx.dtype)
                chunk = max(1, round(0.02 / ctx.t_mm))
                pending: list[Any] = []
                while not self.stop.is_set():
                    work.mm(chunk)
                    self.count += chunk
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    pending.append(ev)
                    # Keep two chunks queued; poll (releasing the GIL) rather than block.
                    while len(pending) > 2 and not self.stop.is_set():
                        if pending[0].query():
                            pending.pop(0)
                        else:
                            time.sleep(0.001)
                stream.synchronize()
        except Exception as e:  # reported by the figure
            self.error = err(e)


class Ctx:
    """What the figures share: options, the NVML handle, torch and the calibrated workload."""

    def __init__(self, args: argparse.Namespace, nvml: Any, handle: Any) -> None:
        self.args = args
        self.P = PARAMS["quick" if args.quick else "full"]
        self.gpu: int = args.gpu
        self.nvml = nvml
        self.h = handle
        self.torch: Any = None
        self.torch_error: str | None = None
        self.dev: Any = None
        self.dtype: Any = None
        self.work: Work | None = None
        self.t_mm = 0.0
        self.n_step = 1
        self.n_unit = 1
        self.zeus_gpus: Any = None
        self.threads: list[Any] = []  # objects with a `stop` Event, set at the end
        self.original_limit_mw: int | None = None

    def counter_mj(self) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.h))

    def power_instant_mw(self) -> float:
        nvml = self.nvml
        field = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", 186)
        fv = nvml.nvmlDeviceGetFieldValues(self.h, [field])[0]
        if fv.nvmlReturn != 0:
            raise nvml.NVMLError(fv.nvmlReturn)
        names = {
            "NVML_VALUE_TYPE_DOUBLE": "dVal",
            "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
            "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
            "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
            "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
            "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
            "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
        }
        for const, attr in names.items():
            if getattr(nvml, const, None) == fv.valueType:
                return getattr(fv.value, attr)
        return fv.value.uiVal

    def readers(self) -> dict[str, Callable[[], Any]]:
        h, nvml = self.h, self.nvml
        return {
            "energy_counter": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h),
            "power_usage": lambda: nvml.nvmlDeviceGetPowerUsage(h),
            "power_instant": self.power_instant_mw,
        }

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.dev)

    def now(self) -> float:
        """The clock of PowerMonitor timestamps (the zeus backend's; time.time() on NVML)."""
        now = getattr(self.zeus_gpus, "now", None)
        return now() if callable(now) else time.time()

    def step(self) -> None:
        assert self.work is not None
        self.work.mm(self.n_step)
        self.sync()

    def busy(self, seconds: float) -> int:
        """Matmuls in ~20 ms synced chunks for `seconds`; ends synced; returns the matmuls."""
        assert self.work is not None
        chunk = max(1, round(0.02 / self.t_mm))
        t0, n = time.perf_counter(), 0
        while True:
            self.work.mm(chunk)
            self.sync()
            n += chunk
            if time.perf_counter() - t0 >= seconds:
                return n

    def elapsed(self) -> float:
        return time.monotonic() - T0

    def remaining(self) -> float:
        return self.P["budget_s"] - self.elapsed()


def nvml_handle(nvml: Any, gpu: int) -> tuple[Any, str]:
    """The NVML handle of framework GPU `gpu` (after CUDA_VISIBLE_DEVICES) and how it was found."""
    try:
        from zeus.device import get_gpus

        uuid = get_gpus().get_uuid(gpu)
        return nvml.nvmlDeviceGetHandleByUUID(uuid), "zeus uuid"
    except Exception:
        pass
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd:
        entry = cvd.split(",")[gpu].strip()
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry)), "CUDA_VISIBLE_DEVICES"
        return nvml.nvmlDeviceGetHandleByUUID(entry), "CUDA_VISIBLE_DEVICES uuid"
    return nvml.nvmlDeviceGetHandleByIndex(gpu), "index"


# How long after an update the energy counter shows it (as measured on an H100, driver 580).
COUNTER_DELAY_S = 0.015

Edge = tuple  # (joules, perf time the joules are counted up to, watts then)


def power_w(ctx: Ctx) -> float:
    try:
        return ctx.power_instant_mw() / 1000
    except Exception:
        return ctx.nvml.nvmlDeviceGetPowerUsage(ctx.h) / 1000


def counter_edge(ctx: Ctx, not_before: float | None = None) -> Edge:
    """Wait for the energy counter's next update; return (J, t, W): its energy up to time t.

    A counter read right after a sync can be up to one update period (100 ms on an H100) stale;
    reading it just as it changes is not. With `not_before` (a perf_counter time), the update
    must come after it, so the energy covers everything up to `not_before`.
    """
    if not_before is not None:
        delay = not_before + COUNTER_DELAY_S + 0.005 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    last = ctx.counter_mj()
    deadline = time.perf_counter() + 2.0
    while True:
        r0 = time.perf_counter()
        v = ctx.counter_mj()
        r1 = time.perf_counter()
        if v != last:
            return v / 1000, (r0 + r1) / 2 - COUNTER_DELAY_S, power_w(ctx)
        if r1 > deadline:
            raise RuntimeError("the energy counter did not change for 2 s")


def edge_energy(e0: Edge, ta: float, e1: Edge, tb: float) -> float:
    """Counter energy over [ta, tb] from edges near ta and tb (the slack at power then)."""
    (j0, t0, p0), (j1, t1, p1) = e0, e1
    return (j1 - j0) - p0 * (ta - t0) - p1 * (t1 - tb)


class CounterPoller(_Worker):
    """Reads the energy counter back to back on a thread; keeps (time, J) at each change."""

    name = "counter-poller"

    def __init__(self, ctx: Ctx) -> None:
        super().__init__(ctx)
        self.points: list[tuple[float, float]] = []

    def _run(self) -> None:
        try:
            last = self.ctx.counter_mj()
            while not self.stop.is_set():
                r0 = time.perf_counter()
                v = self.ctx.counter_mj()
                r1 = time.perf_counter()
                if v != last:
                    self.points.append(((r0 + r1) / 2, v / 1000))
                    last = v
                if r1 - r0 < 5e-4:
                    time.sleep(5e-4)
        except Exception as e:
            self.error = err(e)

    def power_w(self, t0: float, t1: float) -> float | None:
        """Mean power over [t0, t1]: least-squares slope of the counter's updates in it."""
        pts = [p for p in list(self.points) if t0 <= p[0] <= t1]
        if len(pts) < 3:
            return None
        mt = statistics.fmean(t for t, _ in pts)
        mj = statistics.fmean(j for _, j in pts)
        den = sum((t - mt) ** 2 for t, _ in pts)
        return sum((t - mt) * (j - mj) for t, j in pts) / den if den else None


def setup_torch(ctx: Ctx) -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    ctx.torch = torch
    ctx.dev = torch.device("cuda", ctx.gpu)
    torch.cuda.set_device(ctx.dev)
    ctx.dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    ctx.work = Work(torch, ctx.dev, ctx.dtype)
    ctx.work.mm(2)
    ctx.sync()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:  # clocks up, cuBLAS warm
        ctx.work.mm(4)
        ctx.sync()
    n = 10
    t0 = time.perf_counter()
    ctx.work.mm(n)
    ctx.sync()
    t_mm = (time.perf_counter() - t0) / n
    n = max(10, int(0.3 / t_mm))
    t0 = time.perf_counter()
    ctx.work.mm(n)
    ctx.sync()
    ctx.t_mm = (time.perf_counter() - t0) / n
    ctx.n_step = max(1, round(0.05 / ctx.t_mm))
    ctx.n_unit = max(1, round(0.0125 / ctx.t_mm))


# ---- zeus helpers -----------------------------------------------------------------------------


def make_monitors(
    ctx: Ctx, modes: tuple[str, ...] = MODES, fallback: bool = True
) -> tuple[dict[str, Any], dict[str, str]]:
    """`{mode: ZeusMonitor}` for the accepted `reads=` modes, `{mode: error}` for the others.

    With `fallback`, when no mode is accepted (a build without `reads=`), the plain monitor is
    measured as `default` so the figure still says something.
    """
    from zeus.monitor import ZeusMonitor

    mons: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for mode in modes:
        try:
            mons[mode] = ZeusMonitor(gpu_indices=[ctx.gpu], reads=mode)
        except TypeError as e:
            errors[mode] = "no reads= parameter" if "reads" in str(e) else err(e)
        except Exception as e:
            errors[mode] = err(e)
    if not mons and fallback:
        mons["default"] = ZeusMonitor(gpu_indices=[ctx.gpu])
    return mons, errors


def close_monitors(mons: dict[str, Any]) -> None:
    for m in mons.values():
        for name in ("close", "stop"):
            fn = getattr(m, name, None)
            if callable(fn):
                try:
                    fn()
                except Exception as e:
                    log(f"closing {m!r}: {err(e)}")
                break
    mons.clear()


def window_energy(measurement: Any, gpu: int) -> float:
    try:
        return float(measurement.energy[gpu])
    except (KeyError, TypeError, AttributeError):
        return float(measurement.total_energy)


def probe_exact(monitor: Any) -> str | None:
    """None if `end_window(..., exact=True)` works on `monitor`, else why not."""
    monitor.begin_window("__probe_exact", sync_cuda=False)
    try:
        monitor.end_window("__probe_exact", sync_cuda=False, exact=True)
        return None
    except TypeError as e:
        try:
            monitor.end_window("__probe_exact", sync_cuda=False, cancel=True)
        except Exception:
            pass
        return "no exact= parameter" if "exact" in str(e) else err(e)


def rotated(names: list[str], i: int) -> list[str]:
    k = i % len(names) if names else 0
    return names[k:] + names[:k]


def spread(values: list[float], truth: float) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    mean = statistics.fmean(values)
    return {
        "n": len(values),
        "rel_std_pct": statistics.stdev(values) / mean * 100 if len(values) > 1 and mean else None,
        "worst_abs_dev_pct": max(abs(v / truth - 1) for v in values) * 100,
        "mean_bias_pct": (mean / truth - 1) * 100,
        "zero_windows": sum(1 for v in values if v == 0),
    }


# ---- figures ----------------------------------------------------------------------------------


def fig_nvml_read_cost(ctx: Ctx) -> None:
    out: dict[str, Any] = {}
    for name, fn in ctx.readers().items():
        n = ctx.P["energy_calls"] if name == "energy_counter" else ctx.P["read_calls"]
        try:
            fn()
            wall: list[float] = []
            cpu: list[float] = []
            deadline = time.monotonic() + 10.0
            for _ in range(n):
                w0, c0 = time.perf_counter(), time.thread_time()
                fn()
                c1, w1 = time.thread_time(), time.perf_counter()
                wall.append(w1 - w0)
                cpu.append(c1 - c0)
                if time.monotonic() > deadline:
                    break
            out[name] = {
                "calls": len(wall),
                "wall_us": summary(wall, 1e6),
                "cpu_us": summary(cpu, 1e6),
            }
        except Exception as e:
            out[name] = {"error": err(e)}
    emit("nvml_read_cost", **out, unit="us per call")


def fig_update_period(ctx: Ctx) -> None:
    out: dict[str, Any] = {}
    poll_s = ctx.P["poll_s"]
    with BackgroundLoad(ctx) as load:
        time.sleep(0.5)
        c_load0, t_load0 = load.count, time.perf_counter()
        for name, fn in ctx.readers().items():
            try:
                last = fn()
                changes: list[float] = []
                polls = 0
                t_end = time.perf_counter() + poll_s
                while True:
                    v = fn()
                    t = time.perf_counter()
                    polls += 1
                    if v != last:
                        changes.append(t)
                        last = v
                    if t >= t_end:
                        break
                intervals = [b - a for a, b in zip(changes, changes[1:])]
                out[name] = {
                    "changes_per_s": len(changes) / poll_s,
                    "interval_ms": summary(intervals, 1e3),
                    "polls": polls,
                }
            except Exception as e:
                out[name] = {"error": err(e)}
        try:
            from zeus.monitor.power import infer_counter_update_period

            out["zeus_sampling_period_s"] = infer_counter_update_period([ctx.gpu])
        except Exception as e:
            out["zeus_sampling_period_s"] = None
            out["zeus_sampling_period_error"] = err(e)
        load_rate = (load.count - c_load0) / max(1e-9, time.perf_counter() - t_load0)
    try:
        from zeus.device import get_gpus

        get_period = getattr(get_gpus(), "get_power_update_period", None)
        if get_period is None:
            out["zeus_reported_period_s"] = None
            out["zeus_reported_period_error"] = "no GPUs.get_power_update_period"
        else:
            out["zeus_reported_period_s"] = get_period(ctx.gpu)
    except Exception as e:
        out["zeus_reported_period_s"] = None
        out["zeus_reported_period_error"] = err(e)
    out["load_matmuls_queued_per_s"] = load_rate
    out["load_busy_fraction"] = load_rate * ctx.t_mm  # ~1 when the load kept the GPU busy
    if load.error:
        out["load_error"] = load.error
    emit("update_period", **out, poll_s=poll_s, unit="changes/s, ms")


def _process_cpu_share(seconds: float) -> float:
    p0, w0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - p0) / (time.perf_counter() - w0) * 100


def _pair_costs(ctx: Ctx, m: Any, n: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for sync in (False, True):
        key = f"wc_{int(sync)}"
        wall: list[float] = []
        cpu: list[float] = []
        deadline = time.monotonic() + 10.0
        p0 = time.process_time()
        for i in range(n + 5):
            w0, c0 = time.perf_counter(), time.thread_time()
            m.begin_window(key, sync_cuda=sync)
            m.end_window(key, sync_cuda=sync)
            c1, w1 = time.thread_time(), time.perf_counter()
            if i >= 5:
                wall.append(w1 - w0)
                cpu.append(c1 - c0)
            if time.monotonic() > deadline:
                break
        res[f"sync_{str(sync).lower()}"] = {
            "pairs": len(wall),
            "wall_us": summary(wall, 1e6),
            "cpu_us": summary(cpu, 1e6),
            "process_cpu_per_pair_us": (time.process_time() - p0) / max(1, len(wall)) * 1e6,
        }
    return res


def fig_window_cost(ctx: Ctx) -> None:
    out: dict[str, Any] = {}
    ctx.sync()
    # Monitors one at a time, direct first: a cached monitor starts a process-wide sampler
    # thread whose CPU `background_cpu_pct` shows (it may outlive the monitor).
    bg: dict[str, Any] = {"baseline": _process_cpu_share(ctx.P["bg_cpu_s"])}
    for mode in MODES:
        mons, errors = make_monitors(ctx, (mode,), fallback=False)
        if mode in errors:
            out[mode] = {"error": errors[mode]}
            continue
        try:
            time.sleep(0.3)  # let a cached mode's sampler start
            bg[mode] = _process_cpu_share(ctx.P["bg_cpu_s"])
            n = ctx.P["pairs"] if mode == "cached" else ctx.P["pairs_direct"]
            out[mode] = _pair_costs(ctx, mons[mode], n)
        finally:
            close_monitors(mons)
    if all("error" in out[mode] for mode in MODES):
        mons, _ = make_monitors(ctx, ())
        try:
            bg["default"] = _process_cpu_share(ctx.P["bg_cpu_s"])
            out["default"] = _pair_costs(ctx, mons["default"], ctx.P["pairs_direct"])
        finally:
            close_monitors(mons)
    emit("window_cost", **out, background_cpu_pct=bg, unit="us per pair")


def fig_step_overhead(ctx: Ctx) -> None:
    mons, errors = make_monitors(ctx)
    try:
        for _ in range(10):
            ctx.step()
        modes = ["none", *mons]
        half = max(1, ctx.P["steps"] // 2)
        times: dict[str, list[float]] = {m: [] for m in modes}
        for mode in modes + modes[::-1]:
            m = mons.get(mode)
            for _ in range(half):
                t0 = time.perf_counter()
                if m is not None:
                    m.begin_window("step")
                ctx.step()
                if m is not None:
                    m.end_window("step")
                times[mode].append(time.perf_counter() - t0)
    finally:
        close_monitors(mons)
    base_mean = statistics.fmean(times["none"])
    base_med = statistics.median(times["none"])
    out: dict[str, Any] = {}
    for mode, ts in times.items():
        mean, med = statistics.fmean(ts), statistics.median(ts)
        out[mode] = {
            "steps": len(ts),
            "mean_ms": mean * 1e3,
            "median_ms": med * 1e3,
            "std_ms": statistics.stdev(ts) * 1e3 if len(ts) > 1 else None,
            "overhead_pct": pct(mean, base_mean) if mode != "none" else 0.0,
            "overhead_median_pct": pct(med, base_med) if mode != "none" else 0.0,
        }
    for mode, e in errors.items():
        out[mode] = {"error": e}
    emit("step_overhead", **out, step_matmuls=ctx.n_step, sync_cuda=True, unit="ms, %")


def fig_window_vs_counter(ctx: Ctx) -> None:
    mons, errors = make_monitors(ctx)
    names = list(mons)
    counter_j: list[float] = []
    aligned_j: list[float] = []
    window_s: list[float] = []
    energy: dict[str, list[float]] = {n: [] for n in names}
    try:
        ctx.busy(0.5)
        for w in range(ctx.P["wvc_windows"]):
            order = rotated(names, w)
            ctx.sync()
            e0 = counter_edge(ctx)  # a fresh read: also the "just before" one
            t0 = time.perf_counter()
            for n in order:
                mons[n].begin_window("wvc", sync_cuda=True)
            ctx.busy(ctx.P["wvc_s"])
            got = {n: mons[n].end_window("wvc", sync_cuda=True) for n in reversed(order)}
            ctx.sync()
            t1 = time.perf_counter()
            c1 = ctx.counter_mj()
            e1 = counter_edge(ctx, not_before=t1)
            counter_j.append(c1 / 1000 - e0[0])
            aligned_j.append(edge_energy(e0, t0, e1, t1))
            window_s.append(t1 - t0)
            for n in names:
                energy[n].append(window_energy(got[n], ctx.gpu))
            log(
                f"window_vs_counter {w}: counter {counter_j[-1]:.1f} J, aligned {aligned_j[-1]:.1f}"
            )
    finally:
        close_monitors(mons)
    out: dict[str, Any] = {}
    for n in names:
        row: dict[str, Any] = {"energy_j": energy[n]}
        for key, ref in (("diff", counter_j), ("diff_aligned", aligned_j)):
            diffs = [pct(e, c) for e, c in zip(energy[n], ref)]
            ok = [d for d in diffs if d is not None]
            row[f"{key}_pct"] = diffs
            row[f"mean_{key}_pct"] = statistics.fmean(ok) if ok else None
            row[f"max_abs_{key}_pct"] = max(abs(d) for d in ok) if ok else None
        out[n] = row
    for mode, e in errors.items():
        out[mode] = {"error": e}
    emit(
        "window_vs_counter",
        counter_j=counter_j,
        counter_aligned_j=aligned_j,
        window_s=window_s,
        **out,
        unit="J, %",
    )


def _pick(result: Any, gpu: int, domain: str) -> float:
    """The energy of `gpu` (and `domain`) from a get_energy result of whatever shape."""
    for _ in range(3):
        if not isinstance(result, dict):
            break
        if gpu in result:
            result = result[gpu]
        elif domain in result:
            result = result[domain]
        elif len(result) == 1:
            result = next(iter(result.values()))
        else:
            raise ValueError(f"cannot find GPU {gpu} / {domain} in {result!r}")
    return float(result)


def fig_power_monitor_domains(ctx: Ctx) -> None:
    from zeus.monitor import PowerMonitor

    accepted: list[str] = []
    rejected: dict[str, str] = {}
    for d in DOMAINS:
        try:
            pm = PowerMonitor(gpu_indices=[ctx.gpu], power_domains=[d])
        except (ValueError, TypeError) as e:
            rejected[d] = err(e)
            continue
        getattr(pm, "stop", lambda: None)()
        accepted.append(d)
    legacy = not accepted and all("power_domains" in r for r in rejected.values())
    if not accepted and not legacy:
        emit("power_monitor_domains", error="no power domain accepted", rejected=rejected)
        return
    pms: dict[str, Any] = {}
    try:
        if legacy:
            pms["default"] = PowerMonitor(gpu_indices=[ctx.gpu])
        else:
            try:
                both = PowerMonitor(gpu_indices=[ctx.gpu], power_domains=accepted)
                pms = dict.fromkeys(accepted, both)
            except (ValueError, TypeError):
                for d in accepted:
                    pms[d] = PowerMonitor(gpu_indices=[ctx.gpu], power_domains=[d])
        no_domain_kw = False

        def energy(d: str, start: float, end: float) -> float | None:
            nonlocal no_domain_kw
            pm = pms[d]
            if d == "default" or no_domain_kw:
                r = pm.get_energy(start, end)
            else:
                try:
                    r = pm.get_energy(start, end, power_domain=d)
                except TypeError:
                    no_domain_kw = True
                    r = pm.get_energy(start, end)
            return None if r is None else _pick(r, ctx.gpu, d)

        ctx.sync()
        time.sleep(1.5)  # samplers running, GPU idle
        errs: dict[str, dict[str, list[Any]]] = {
            d: {k: [] for k in ("A", "B", "A_naive", "B_naive")} for d in pms
        }
        counters: dict[str, list[float]] = {k: [] for k in ("A", "B", "A_naive", "B_naive")}
        load_w: list[float] = []
        for rep in range(ctx.P["pm_reps"]):
            off = ctx.now() - time.perf_counter()  # perf_counter -> PowerMonitor's clock
            eb0 = counter_edge(ctx)
            tb0 = time.perf_counter()
            time.sleep(1.0)
            ea0 = counter_edge(ctx)  # fresh: also the read "right at load start"
            ta0 = time.perf_counter()
            ctx.busy(ctx.P["pm_load_s"])
            ta1 = time.perf_counter()
            ca1 = ctx.counter_mj()
            ea1 = counter_edge(ctx, not_before=ta1)
            time.sleep(max(0.0, ta1 + 1.0 - time.perf_counter()))
            tb1 = time.perf_counter()
            cb1 = ctx.counter_mj()
            eb1 = counter_edge(ctx, not_before=tb1)
            time.sleep(0.5)  # samples past the end
            ref = {
                "A": edge_energy(ea0, ta0, ea1, ta1),
                "B": edge_energy(eb0, tb0, eb1, tb1),
                "A_naive": ca1 / 1000 - ea0[0],
                "B_naive": cb1 / 1000 - eb0[0],
            }
            for k, v in ref.items():
                counters[k].append(v)
            load_w.append(ref["A"] / (ta1 - ta0))
            for d in pms:
                for sc, (s0, s1) in (("A", (ta0, ta1)), ("B", (tb0, tb1))):
                    try:
                        j = energy(d, s0 + off, s1 + off)
                        errs[d][sc].append(None if j is None else pct(j, ref[sc]))
                        naive = sc + "_naive"
                        errs[d][naive].append(None if j is None else pct(j, ref[naive]))
                    except Exception as ex:
                        errs[d][sc].append(err(ex))
                        errs[d][sc + "_naive"].append(err(ex))
            log(f"power_monitor_domains rep {rep}: load {ref['A']:.1f} J")
    finally:
        for pm in {id(p): p for p in pms.values()}.values():
            getattr(pm, "stop", lambda: None)()
    out: dict[str, Any] = {}
    for d, e in errs.items():
        row: dict[str, Any] = {}
        for sc in ("A", "B", "A_naive", "B_naive"):
            nums = [x for x in e[sc] if isinstance(x, (int, float))]
            row[f"{sc}_err_pct"] = e[sc]
            row[f"{sc}_mean_err_pct"] = statistics.fmean(nums) if nums else None
        period = getattr(pms[d], "update_period", None)
        row["update_period_s"] = period if isinstance(period, (int, float)) else None
        out[d] = row
    emit(
        "power_monitor_domains",
        accepted=accepted,
        rejected=rejected,
        legacy_no_power_domains=legacy,
        get_energy_without_power_domain=no_domain_kw,
        counter_A_j=counters["A"],
        counter_B_j=counters["B"],
        counter_A_naive_j=counters["A_naive"],
        counter_B_naive_j=counters["B_naive"],
        load_power_w=load_w,
        domains=out,
        unit="% vs counter",
    )


def truth_per_unit(ctx: Ctx, seconds: float) -> tuple[float, float]:
    """Energy per unit of matmuls over a long run of units (`seconds`): (aligned reads, naive
    reads after syncs)."""
    assert ctx.work is not None
    work, n_unit = ctx.work, ctx.n_unit
    chunk = max(1, round(0.1 / (n_unit * ctx.t_mm)))
    ctx.sync()
    e0 = counter_edge(ctx)
    t0, units = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        work.mm(n_unit * chunk)
        units += chunk
        ctx.sync()
    t1 = time.perf_counter()
    c1 = ctx.counter_mj()
    e1 = counter_edge(ctx, not_before=t1)
    return edge_energy(e0, t0, e1, t1) / units, (c1 / 1000 - e0[0]) / units


def fig_bounds_vs_error(ctx: Ctx) -> None:
    """Per window length: the bound each window reports against its observed error (energy
    vs the energy per unit of 3 s truth windows), and the self-check's mode (provenance)."""
    assert ctx.work is not None
    work, P, gpu, n_unit = ctx.work, ctx.P, ctx.gpu, ctx.n_unit
    t_unit = n_unit * ctx.t_mm
    rng = random.Random(1)
    mons, errors = make_monitors(ctx, modes=("cached",), fallback=False)
    if "cached" not in mons:
        emit("bounds_vs_error", error=errors.get("cached", "no cached monitor"))
        return
    m = mons["cached"]
    rows: dict[str, list[tuple[float, float, float, str]]] = {}
    truth: list[float] = []
    try:
        ctx.busy(1.0)
        truth.append(truth_per_unit(ctx, 3.0)[0])
        for length in P["bound_lengths"]:
            units = max(1, round(length / t_unit))
            for _ in range(P["bound_windows"]):
                if rng.random() < 0.5:
                    time.sleep(rng.uniform(0.05, 0.3))  # the GPU idles: the load steps at edges
                m.begin_window("bw", sync_cuda=True)
                work.mm(n_unit * units)
                got = m.end_window("bw", sync_cuda=True)
                bound = getattr(got, "gpu_energy_uncertainty", {}).get(gpu)
                prov = getattr(got, "gpu_energy_provenance", {}).get(gpu)
                method = getattr(prov, "method", "unknown")
                rows.setdefault(f"{length:g}", []).append(
                    (
                        window_energy(got, gpu),
                        units,
                        bound if bound is not None else math.nan,
                        method,
                    )
                )
        truth.append(truth_per_unit(ctx, 3.0)[0])
    finally:
        close_monitors(mons)
    per_unit = statistics.fmean(truth)
    out: dict[str, Any] = {}
    for length, vals in rows.items():
        errs = [abs(e - per_unit * u) / (per_unit * u) * 100 for e, u, _, _ in vals]
        bounds = [b / (per_unit * u) * 100 for _, u, b, _ in vals]
        covered = [abs(e - per_unit * u) <= b for e, u, b, _ in vals]
        methods: dict[str, int] = {}
        for *_, meth in vals:
            methods[meth] = methods.get(meth, 0) + 1
        out[length] = {
            "n": len(vals),
            "median_bound_pct": statistics.median(bounds),
            "median_abs_err_pct": statistics.median(errs),
            "mean_abs_err_pct": statistics.fmean(errs),
            "covered_frac": sum(covered) / len(covered),
            "methods": methods,
        }
        log(
            f"bounds_vs_error {length} s: bound {out[length]['median_bound_pct']:.2f}% "
            f"error {out[length]['median_abs_err_pct']:.2f}% covered "
            f"{out[length]['covered_frac']:.2f} {methods}"
        )
    emit(
        "bounds_vs_error",
        truth_j_per_unit=per_unit,
        truth_windows_j_per_unit=truth,
        lengths=out,
        unit="% of the window's truth energy",
    )


def fig_short_window_spread(ctx: Ctx) -> None:
    assert ctx.work is not None
    work, P, gpu, n_unit = ctx.work, ctx.P, ctx.gpu, ctx.n_unit
    t_unit = n_unit * ctx.t_mm
    rng = random.Random(0)
    lo = max(1, math.ceil(0.2 / t_unit))
    hi = max(lo, math.floor(0.33 / t_unit))
    plan = [
        (rng.randint(lo, hi), rng.uniform(0.0, 0.2) if rng.random() < 0.5 else 0.0)
        for _ in range(P["short_windows"])
    ]

    def truth_window() -> tuple[float, float]:
        return truth_per_unit(ctx, P["truth_s"])

    def run_pass(m: Any, exact: bool) -> tuple[list[float], list[float]]:
        """The plan's windows, one after another, each wrapping exactly its units."""
        per_unit: list[float] = []
        lengths: list[float] = []
        for units, gap in plan:
            if gap:
                time.sleep(gap)  # the GPU idles (synced)
            m.begin_window("sw", sync_cuda=True)
            t0 = time.perf_counter()
            work.mm(n_unit * units)
            if exact:
                got = m.end_window("sw", sync_cuda=True, exact=True)
            else:
                got = m.end_window("sw", sync_cuda=True)
            lengths.append(time.perf_counter() - t0)
            per_unit.append(window_energy(got, gpu) / units)
        return per_unit, lengths

    mons, errors = make_monitors(ctx)
    exact_error: str | None = "no reads='cached' monitor"
    if "cached" in mons:
        exact_error = probe_exact(mons["cached"])
    passes: list[tuple[str, Any, bool]] = [(n, m, False) for n, m in mons.items()]
    if exact_error is None:
        passes.append(("cached_exact", mons["cached"], True))
    results: dict[str, list[float]] = {}
    lengths: list[float] = []
    truth: list[float] = []
    naive: list[float] = []
    try:
        ctx.busy(1.0)
        for _ in range(max(1, P["truth_windows"] - 1)):
            a, b = truth_window()
            truth.append(a)
            naive.append(b)
        log(f"short_window_spread truth {truth} (naive {naive})")
        for name, m, exact in passes:
            results[name], ls = run_pass(m, exact)
            lengths += ls
            log(f"short_window_spread {name} done")
        a, b = truth_window()
        truth.append(a)
        naive.append(b)
    finally:
        close_monitors(mons)
    t_mean = statistics.fmean(truth)
    modes: dict[str, Any] = {n: spread(v, t_mean) for n, v in results.items()}
    for mode, e in errors.items():
        modes[mode] = {"error": e}
    if exact_error is not None:
        modes["cached_exact"] = {"error": exact_error}
    emit(
        "short_window_spread",
        truth_j_per_unit=t_mean,
        truth_windows_j_per_unit=truth,
        truth_spread_pct=(max(truth) - min(truth)) / t_mean * 100,
        truth_naive_windows_j_per_unit=naive,
        unit_matmuls=n_unit,
        unit_ms=t_unit * 1e3,
        windows_per_mode=len(plan),
        window_s={"min": min(lengths), "mean": statistics.fmean(lengths), "max": max(lengths)},
        modes=modes,
        unit="% of truth energy per unit",
    )


def _no_permission(nvml: Any, e: Exception) -> bool:
    cls = getattr(nvml, "NVMLError_NoPermission", None)
    if cls is not None and isinstance(e, cls):
        return True
    return getattr(e, "value", None) == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4)


def fig_plo_regret(ctx: Ctx) -> None:
    nvml, h, P = ctx.nvml, ctx.h, ctx.P
    try:
        nvml.nvmlDeviceSetPowerManagementLimit(h, nvml.nvmlDeviceGetPowerManagementLimit(h))
    except nvml.NVMLError as e:
        if _no_permission(nvml, e):
            emit("plo_regret", error=f"no permission to set power limits (needs root): {err(e)}")
            return
        raise
    min_mw, max_mw = nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
    step_w = P["pl_step_w"]
    limits = list(range(max_mw, min_mw - 1, -step_w * 1000))
    eta, max_w = 0.5, max_mw / 1000
    est = len(limits) * (P["sweep_warm_s"] + P["sweep_meas_s"] + 0.2 + 50 * 0.05 * 1.3) + 5
    if est > ctx.remaining():
        emit("plo_regret", error=f"skipped: needs ~{est:.0f} s, {ctx.remaining():.0f} s left")
        return
    log(f"plo_regret: sweeping {len(limits)} limits {max_mw // 1000}..{limits[-1] // 1000} W")
    sweep: list[dict[str, Any]] = []
    # Energy per step = mean power (slope of the counter's updates, read by a thread) x time per
    # step: two counter reads 2 s apart would each be up to an update period stale.
    with CounterPoller(ctx) as poller:
        for pl in limits:
            nvml.nvmlDeviceSetPowerManagementLimit(h, pl)
            t_end = time.perf_counter() + P["sweep_warm_s"]
            while time.perf_counter() < t_end:
                ctx.step()
            c0, t0, n = ctx.counter_mj(), time.perf_counter(), 0
            while True:
                ctx.step()
                n += 1
                if time.perf_counter() - t0 >= P["sweep_meas_s"]:
                    break
            t1, c1 = time.perf_counter(), ctx.counter_mj()
            t = (t1 - t0) / n
            naive = (c1 - c0) / 1000 / n
            watts = poller.power_w(t0, t1)
            e = watts * t if watts is not None else naive
            cost = eta * e + (1 - eta) * max_w * t
            sweep.append(
                {
                    "power_limit_w": pl // 1000,
                    "step_ms": t * 1e3,
                    "step_j": e,
                    "step_j_naive": naive,
                    "power_w": watts,
                    "cost": cost,
                }
            )
            log(f"  {pl // 1000} W: {t * 1e3:.1f} ms, {e:.2f} J per step (naive {naive:.2f})")
    if poller.error:
        log(f"counter poller: {poller.error}")
    nvml.nvmlDeviceSetPowerManagementLimit(h, max_mw)
    costs = {row["power_limit_w"]: row["cost"] for row in sweep}
    best_w = min(costs, key=lambda w: costs[w])

    from zeus.monitor import ZeusMonitor
    from zeus.optimizer.power_limit import GlobalPowerLimitOptimizer, ZeusCost

    monitor = ZeusMonitor(gpu_indices=[ctx.gpu])
    warmup, profile = 10, 40
    max_steps = int((len(limits) * (warmup + profile) + 10) * 1.5) + 20
    cap_s = max(10.0, ctx.remaining() - 15.0)
    steps, t0 = 0, time.perf_counter()
    with GlobalPowerLimitOptimizer(
        monitor,
        optimum_selector=ZeusCost(eta_knob=eta, world_size=1),
        warmup_steps=warmup,
        profile_steps=profile,
        pl_step=step_w,
    ) as plo:
        while type(plo.state).__name__ != "Done":
            if steps >= max_steps or time.perf_counter() - t0 > cap_s:
                break
            plo.on_step_begin()
            ctx.step()
            steps += 1
        plo_s = time.perf_counter() - t0
        state = plo.state
        chosen_mw = getattr(state, "optimal_power_limit", None)
        plo_rows = [
            {
                "power_limit_w": m.power_limit,
                "step_ms": m.time / profile * 1e3,
                "step_j": m.energy / profile,
            }
            for m in getattr(plo, "measurements", [])
        ]
        profiled = [p // 1000 for p in getattr(plo, "power_limits", [])]
    out: dict[str, Any] = {
        "sweep": sweep,
        "sweep_best_w": best_w,
        "plo_state": type(state).__name__,
        "plo_steps": steps,
        "plo_s": plo_s,
        "plo_profiled_w": profiled,
        "plo_measurements": plo_rows,
    }
    if chosen_mw is None:
        emit("plo_regret", **out, error=f"optimizer did not finish ({type(state).__name__})")
        return
    chosen_w = int(chosen_mw) // 1000
    nearest = min(costs, key=lambda w: abs(w - chosen_w))
    out.update(
        chosen_w=chosen_w,
        chosen_cost_from_w=nearest,
        regret_pct=pct(costs[nearest], costs[best_w]),
    )
    emit("plo_regret", **out, eta_knob=eta, max_power_w=max_w, unit="W, %")


FIGURE_FUNCS: dict[str, Callable[[Ctx], None]] = {
    "nvml_read_cost": fig_nvml_read_cost,
    "update_period": fig_update_period,
    "window_cost": fig_window_cost,
    "step_overhead": fig_step_overhead,
    "window_vs_counter": fig_window_vs_counter,
    "power_monitor_domains": fig_power_monitor_domains,
    "short_window_spread": fig_short_window_spread,
    "bounds_vs_error": fig_bounds_vs_error,
    "plo_regret": fig_plo_regret,
}


# ---- main -------------------------------------------------------------------------------------


def restore(ctx: Ctx) -> None:
    nvml, h = ctx.nvml, ctx.h
    out: dict[str, Any] = {}
    errors: dict[str, str] = {}
    default = None
    try:
        default = nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)
        out["default_w"] = default / 1000
        nvml.nvmlDeviceSetPowerManagementLimit(h, default)
    except Exception as e:
        errors["power_limit"] = err(e)
    try:
        nvml.nvmlDeviceResetGpuLockedClocks(h)
        out["locked_clocks_reset"] = True
    except Exception as e:
        out["locked_clocks_reset"] = False
        errors["locked_clocks"] = err(e)
    try:
        now = nvml.nvmlDeviceGetPowerManagementLimit(h)
        out["power_limit_w"] = now / 1000
        out["power_limit_ok"] = default is not None and now == default
    except Exception as e:
        errors["read_back"] = err(e)
    if ctx.original_limit_mw is not None:
        out["original_w"] = ctx.original_limit_mw / 1000
    emit("restored", **out, errors=errors, unit="W")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Real-GPU checks of zeus (one JSON line per figure on stdout).",
        epilog="figures: " + ", ".join(FIGURES),
    )
    p.add_argument("--quick", action="store_true", help="shorter runs (about 2 minutes)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index (framework index), default 0")
    p.add_argument("--only", action="append", default=[], choices=FIGURES, metavar="NAME")
    p.add_argument("--skip", action="append", default=[], choices=FIGURES, metavar="NAME")
    return p.parse_args(argv)


def _on_term(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    global _OUT
    args = parse_args(argv)
    _OUT, sys.stdout = sys.stdout, sys.stderr
    warnings.simplefilter("ignore")  # short windows warn; not what is measured
    signal.signal(signal.SIGTERM, _on_term)
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise RuntimeError("NVML finds no GPU")
        if args.gpu < 0 or args.gpu >= count:
            raise RuntimeError(f"--gpu {args.gpu}: NVML finds {count} GPU(s)")
        handle, how = nvml_handle(pynvml, args.gpu)
    except BaseException as e:
        emit("environment", error=err(e))
        return 2

    ctx = Ctx(args, pynvml, handle)
    figures = [f for f in FIGURES if (not args.only or f in args.only) and f not in args.skip]
    env: dict[str, Any] = {"gpu_index": args.gpu, "handle_from": how, "quick": args.quick}
    try:
        env["name"] = pynvml.nvmlDeviceGetName(handle)
        env["uuid"] = pynvml.nvmlDeviceGetUUID(handle)
        env["driver"] = pynvml.nvmlSystemGetDriverVersion()
        ctx.original_limit_mw = pynvml.nvmlDeviceGetPowerManagementLimit(handle)
        env["power_limit_w"] = ctx.original_limit_mw / 1000
        env["default_limit_w"] = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000
        lo, hi = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
        env["limit_range_w"] = [lo / 1000, hi / 1000]
    except Exception as e:
        env["nvml_info_error"] = err(e)
    try:
        import zeus

        env["zeus"] = getattr(zeus, "__version__", None)
        env["zeus_path"] = os.path.dirname(zeus.__file__)
        from zeus.device import get_gpus

        ctx.zeus_gpus = get_gpus()
        env["zeus_backend"] = getattr(ctx.zeus_gpus, "backend", None)
    except Exception as e:
        env["zeus_error"] = err(e)
    try:
        if any(f in NEEDS_TORCH for f in figures):
            log("calibrating the matmul load")
            setup_torch(ctx)
            env["torch"] = ctx.torch.__version__
            env["dtype"] = str(ctx.dtype).replace("torch.", "")
            env["matmul_ms"] = ctx.t_mm * 1e3
            env["step_matmuls"] = ctx.n_step
            env["step_ms"] = ctx.n_step * ctx.t_mm * 1e3
            env["unit_matmuls"] = ctx.n_unit
            env["unit_ms"] = ctx.n_unit * ctx.t_mm * 1e3
    except Exception as e:
        ctx.torch_error = err(e)
        env["torch_error"] = ctx.torch_error
    emit("environment", **env)

    try:
        for name in figures:
            if name in NEEDS_TORCH and ctx.work is None:
                emit(name, error=f"torch with CUDA unavailable: {ctx.torch_error}")
                continue
            if ctx.remaining() <= 0:
                emit(name, error=f"skipped: time budget of {ctx.P['budget_s']:.0f} s spent")
                continue
            _logs_to_stderr()
            log(f"{name} ...")
            t0 = time.monotonic()
            try:
                FIGURE_FUNCS[name](ctx)
            except Exception as e:
                emit(name, error=err(e))
            finally:
                if ctx.work is not None:
                    try:
                        ctx.sync()
                    except Exception:
                        pass
            log(f"{name} done in {time.monotonic() - t0:.1f} s")
    finally:
        for th in ctx.threads:
            th.stop.set()
        try:
            restore(ctx)
        finally:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
