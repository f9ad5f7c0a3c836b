"""Cost of per-request energy accounting (`zeus.monitor.serving.EnergyLedger`) in LLM serving.

(a) The ledger's cost per engine step through the Python API, on the simulated GPU: a decode
    step of 1, 64 and 256 requests (`end_step`, and `begin_step` + `end_step` as the
    transformers adapter calls them), less the same loop calling a no-op with the same
    arguments; a bare `ZeusMonitor.cut_window` for reference. Median over repeats, wall time.
(b) End to end on transformers' continuous batching (a tiny random Llama on the CPU): the same
    `generate_batch` workload with `track_continuous_batching` on and off, alternating, median
    wall time and the relative overhead, and the time spent inside the ledger's calls on the
    engine's thread, and in the adapter's hooks beyond the engine's own methods, less the
    timers' own cost (the same timers around pass-through hooks; skipped without
    transformers and torch). The tiny model's steps take milliseconds on the CPU, and
    a run's wall time varies by several percent, more than the adapter costs: the times on the
    engine's thread are the precise figures.

Run: `ZEUS_GPU_BACKEND=sim ZEUS_SIM_GPUS=H100 python3 benchmarks/serving_energy.py`
(the script sets those itself when they are unset). A release build gives the real figures:
`scripts/dev-build --release`.

Usage: python benchmarks/serving_energy.py [--steps N] [--repeat R] [--method M]
       [--e2e-repeat R] [--prompts N] [--new-tokens N] [--threads N] [--skip-e2e]
       [--engine-clock wall|cpu]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("ZEUS_GPU_BACKEND", "sim")
os.environ.setdefault("ZEUS_SIM_GPUS", "H100")

REPO = Path(__file__).resolve().parents[1]
BATCHES = (1, 64, 256)
# The clock of the timers on the engine's thread (b): wall time, or with `--engine-clock cpu`
# the thread's CPU time, which leaves out the waits for the GIL (another thread's turn, several
# ms, landing in whatever code runs when it comes) and for a core.
ENGINE_CLOCK: Callable[[], float] = time.perf_counter


def build_kind() -> str:
    """Which build of `zeus._core` is loaded (debug figures are much slower)."""
    import zeus._core

    so = Path(zeus._core.__file__ or "")
    targets = [REPO / "target"]
    if os.environ.get("CARGO_TARGET_DIR"):
        targets.append(Path(os.environ["CARGO_TARGET_DIR"]))
    for target in targets:
        for mode in ("release", "debug"):
            built = target / mode / "libzeus_core.so"
            if built.is_file() and so.is_file() and filecmp.cmp(built, so, shallow=False):
                return f"{mode} build"
    size = so.stat().st_size / 1e6 if so.is_file() else 0.0
    return f"unknown build, {size:.0f} MB: a debug build is tens of MB"


def median_us(loop: Callable[[int], None], n: int, repeat: int) -> float:
    """Median over `repeat` runs of the wall time per iteration of `loop(n)`, in µs."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        loop(n)
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times) * 1e6


def per_step(
    monitor: Any, method: str, batch: int, steps: int, repeat: int
) -> tuple[float, float, float, float, float]:
    """(loop + no-op, `end_step`, `begin_step` + `end_step`, the same asleep, two no-op calls
    asleep) µs per decode step of `batch` requests; the second and third less the first, the
    fourth less the fifth.

    "Asleep": the median of single `begin_step` + `end_step` pairs, each after the thread
    slept 5 ms, as an engine's thread that waits on the GPU between steps does. The thread
    wakes with cold caches (and, in a VM, on a vCPU that was halted: two no-op Python calls
    then take microseconds too, which the figure leaves out): closer to what a step costs in
    an engine than a tight loop that keeps everything hot.
    """
    from zeus.monitor.serving import EnergyLedger

    ids = [f"req-{i}" for i in range(batch)]
    kv = [float(512 + i) for i in range(batch)]
    args = (ids, [0.0] * batch, [1.0] * batch, kv)
    ledger = EnergyLedger(monitor, method=method, keep=1000)  # type: ignore[arg-type]
    ledger.end_step(ids, [512.0] * batch, [0.0] * batch, kv)  # the requests arrive

    def noop(*_: Any) -> None:
        pass

    def base_loop(n: int) -> None:
        f, a = noop, args
        for _ in range(n):
            f(*a)

    def end_loop(n: int) -> None:
        f, a = ledger.end_step, args
        for _ in range(n):
            f(*a)

    def both_loop(n: int) -> None:
        b, f, a = ledger.begin_step, ledger.end_step, args
        for _ in range(n):
            b()
            f(*a)

    n = max(steps // (1 + batch // 16), 200)
    end_loop(min(n, 1000))  # warm up
    base = median_us(base_loop, n, repeat)
    end = median_us(end_loop, n, repeat) - base
    both = median_us(both_loop, n, repeat) - base
    asleep, asleep_noop = [], []
    b, f = ledger.begin_step, ledger.end_step
    for _ in range(200):
        time.sleep(0.005)
        t0 = time.perf_counter()
        noop()
        noop(*args)
        asleep_noop.append(time.perf_counter() - t0)
        time.sleep(0.005)
        t0 = time.perf_counter()
        b()
        f(*args)
        asleep.append(time.perf_counter() - t0)
    for rid in ids:
        ledger.finish(rid)
    ledger.close()
    wake = statistics.median(asleep_noop) * 1e6
    return base, end, both, statistics.median(asleep) * 1e6 - wake, wake


def step_costs(steps: int, repeat: int, method: str) -> None:
    from zeus.monitor import ZeusMonitor

    warnings.simplefilter("ignore")  # zero-length windows warn once; not what we time
    monitor = ZeusMonitor(gpu_indices=[0])
    time.sleep(0.3)  # let the sampler take its first counter values

    monitor.begin_window("cut", sync_cuda=False)

    def cut_loop(n: int) -> None:
        cut = monitor.cut_window
        for _ in range(n):
            cut("cut", sync_cuda=False)

    cut_loop(1000)
    cut_us = median_us(cut_loop, steps, repeat)
    monitor.end_window("cut", sync_cuda=False)

    print(f"\n(a) ledger cost per engine step, method={method!r}, median of {repeat} repeats")
    print(f"    bare monitor.cut_window: {cut_us:.2f} us")
    print(
        "    requests/step  loop+noop us  end_step us  begin+end us  per request ns"
        "  asleep: begin+end us (no-op us)"
    )
    for batch in BATCHES:
        base, end, both, asleep, wake = per_step(monitor, method, batch, steps, repeat)
        print(
            f"    {batch:13d}  {base:12.2f}  {end:11.2f}  {both:12.2f}  {both / batch * 1e3:14.0f}"
            f"  {asleep:22.1f} ({wake:.1f})"
        )


class TimedLedger:
    """An `EnergyLedger` whose calls (on the engine's thread) are timed."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.seconds = 0.0

    def _timed(self, name: str, *args: Any, **kwargs: Any) -> None:
        t0 = ENGINE_CLOCK()
        getattr(self.ledger, name)(*args, **kwargs)
        self.seconds += ENGINE_CLOCK() - t0

    def arrive(self, *args: Any, **kwargs: Any) -> None:
        self._timed("arrive", *args, **kwargs)

    def begin_step(self, *args: Any) -> None:
        self._timed("begin_step", *args)

    def end_step(self, *args: Any) -> None:
        self._timed("end_step", *args)

    def finish(self, *args: Any, **kwargs: Any) -> None:
        self._timed("finish", *args, **kwargs)


class TimedHooks:
    """Times the adapter's hooks on the engine's thread, less the engine's own methods they
    wrap: the adapter's Python and the ledger's calls, and the timers' own cost.

    With `passthrough`, the per-step hooks (`prepare_next_batch`, `update_batch`) are the
    timed originals alone: the same timers around nothing of ours, whose time is then the
    timers' own cost, to take out of the hooks' (a timer pair costs microseconds with cold
    caches, about a tenth of what it times).
    """

    PER_STEP = frozenset({"prepare_next_batch", "update_batch"})

    def __init__(self) -> None:
        self.active = False
        self.passthrough = False
        self.seconds = 0.0

    def install(self) -> Callable[[], None]:
        """Wrap what `ContinuousBatchingEnergy` patches from now on; returns the undo."""
        from zeus.monitor.serving.transformers import ContinuousBatchingEnergy

        patch = ContinuousBatchingEnergy._patch

        def timed_patch(adapter: Any, obj: Any, name: str, make: Any) -> None:
            if not self.active:
                patch(adapter, obj, name, make)
                return
            passthrough = self.passthrough and name in self.PER_STEP

            def timed_make(original: Callable[..., Any]) -> Callable[..., Any]:
                inner = 0.0

                def timed_original(*args: Any, **kwargs: Any) -> Any:
                    nonlocal inner
                    t0 = ENGINE_CLOCK()
                    try:
                        return original(*args, **kwargs)
                    finally:
                        inner += ENGINE_CLOCK() - t0

                hook = timed_original if passthrough else make(timed_original)

                def timed_hook(*args: Any, **kwargs: Any) -> Any:
                    nonlocal inner
                    inner = 0.0
                    t0 = ENGINE_CLOCK()
                    try:
                        return hook(*args, **kwargs)
                    finally:
                        self.seconds += ENGINE_CLOCK() - t0 - inner

                return timed_hook

            patch(adapter, obj, name, timed_make)

        ContinuousBatchingEnergy._patch = timed_patch  # type: ignore[method-assign,assignment]

        def undo() -> None:
            ContinuousBatchingEnergy._patch = patch  # type: ignore[method-assign]

        return undo


def end_to_end(repeat: int, prompts: int, new_tokens: int, method: str, threads: int) -> None:
    """Runs of the same workload in alternation: without the adapter, with it (wall time),
    with it and its hooks timed, with pass-through hooks timed the same way (the timers'
    cost), and with the ledger's calls timed."""
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"\n(b) skipped: {e}")
        return
    from zeus.monitor.serving import EnergyLedger
    from zeus.monitor.serving.transformers import track_continuous_batching

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    generation = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=new_tokens, eos_token_id=-1, pad_token_id=0
    )
    cb = transformers.ContinuousBatchingConfig(num_blocks=128, page_size=64, max_batch_tokens=256)
    inputs = [[(7 * i + j) % 120 + 1 for j in range(4 + (i * 13) % 60)] for i in range(prompts)]

    def run(ledger: Any) -> tuple[float, dict[str, list[int]]]:
        t0 = time.perf_counter()
        if ledger is None:
            out = model.generate_batch(
                inputs, generation_config=generation, continuous_batching_config=cb
            )
        else:
            with track_continuous_batching(model, ledger):
                out = model.generate_batch(
                    inputs, generation_config=generation, continuous_batching_config=cb
                )
        elapsed = time.perf_counter() - t0
        return elapsed, {k: list(v.generated_tokens) for k, v in out.items()}

    def new_ledger() -> Any:
        return EnergyLedger(method=method)  # type: ignore[arg-type]

    ledgers = {"on": new_ledger(), "hooks": new_ledger(), "timers": new_ledger()}
    timed = TimedLedger(new_ledger())
    hooks = TimedHooks()
    undo = hooks.install()
    wall: dict[str, list[float]] = {"off": [], "on": []}
    hook_s = {"hooks": 0.0, "timers": 0.0}
    calls_s = 0.0
    same = True
    _, reference = run(None)
    for i in range(repeat + 1):  # the first round warms every path up
        t, out = run(None)
        same &= out == reference
        if i:
            wall["off"].append(t)
        t, out = run(ledgers["on"])
        same &= out == reference
        if i:
            wall["on"].append(t)
        for mode in ("hooks", "timers"):
            hooks.active, hooks.passthrough = True, mode == "timers"
            before = hooks.seconds
            _, out = run(ledgers[mode])
            same &= out == reference
            if i:
                hook_s[mode] += hooks.seconds - before
            hooks.active = False
        before = timed.seconds
        _, out = run(timed)
        same &= out == reference
        if i:
            calls_s += timed.seconds - before
    undo()
    for ledger in (*ledgers.values(), timed.ledger):
        ledger.close()
    steps = ledgers["on"].totals().steps / (repeat + 1)
    records = len(ledgers["on"].records)
    per_step_us = {k: v / (steps * repeat) * 1e6 for k, v in hook_s.items()}
    calls_us = calls_s / (steps * repeat) * 1e6
    adapter_us = per_step_us["hooks"] - per_step_us["timers"]
    m_off, m_on = statistics.median(wall["off"]), statistics.median(wall["on"])
    diffs = [b - a for a, b in zip(wall["off"], wall["on"])]
    q1, _, q3 = statistics.quantiles(diffs, n=4)

    def share(us: float) -> str:
        return f"{us * steps / 1e6 / m_off * 100:.3f} % of a run"

    print(
        f"\n(b) transformers generate_batch: {prompts} prompts of 4-63 tokens, {new_tokens} new "
        f"tokens each, tiny Llama on CPU ({threads} torch thread(s)), method={method!r}, "
        f"{repeat} alternating repeats"
    )
    print(
        f"    engine steps per run: {steps:.0f} ({m_off / steps * 1e3:.1f} ms each); records: "
        f"{records}; outputs identical on/off: {same}"
    )
    print("    adapter  median s  min s    max s")
    print(f"    off      {m_off:8.4f}  {min(wall['off']):7.4f}  {max(wall['off']):7.4f}")
    print(f"    on       {m_on:8.4f}  {min(wall['on']):7.4f}  {max(wall['on']):7.4f}")
    d = m_on - m_off
    print(
        f"    overhead (median on - median off): {d * 1e3:+.1f} ms per run "
        f"({d / m_off * 100:+.2f} %), {d / steps * 1e6:+.0f} us per step"
    )
    print(
        f"    paired differences (on - off): median {statistics.median(diffs) * 1e3:+.1f} ms, "
        f"quartiles {q1 * 1e3:+.1f} .. {q3 * 1e3:+.1f} ms"
    )
    print(
        f"    time inside ledger calls on the engine thread: {calls_us:.1f} us per step "
        f"({share(calls_us)})"
    )
    print(
        f"    time in the adapter's hooks beyond the engine's own work: "
        f"{per_step_us['hooks']:.1f} us per step with the timers' own "
        f"{per_step_us['timers']:.1f} us (pass-through hooks timed alike): "
        f"adapter and ledger {adapter_us:.1f} us per step ({share(adapter_us)})"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--steps", type=int, default=20_000, help="steps timed per repeat (a)")
    p.add_argument("--repeat", type=int, default=7, help="repeats (a)")
    p.add_argument("--method", choices=["tokens", "work", "time"], default="tokens")
    p.add_argument("--e2e-repeat", type=int, default=10, help="alternating repeats (b)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (b)")
    p.add_argument("--prompts", type=int, default=32, help="prompts per generate_batch (b)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt (b)")
    p.add_argument("--skip-e2e", action="store_true", help="only (a)")
    p.add_argument(
        "--engine-clock",
        choices=["wall", "cpu"],
        default="wall",
        help="the timers' clock on the engine's thread (b): wall time or the thread's CPU time",
    )
    args = p.parse_args()
    global ENGINE_CLOCK
    ENGINE_CLOCK = time.thread_time if args.engine_clock == "cpu" else time.perf_counter

    import zeus._core

    print(f"python {sys.version.split()[0]}; zeus._core: {zeus._core.__file__} ({build_kind()})")
    print(
        f"GPU: ZEUS_GPU_BACKEND={os.environ['ZEUS_GPU_BACKEND']} "
        f"ZEUS_SIM_GPUS={os.environ.get('ZEUS_SIM_GPUS', '')} "
        f"ZEUS_SIM_FIDELITY={os.environ.get('ZEUS_SIM_FIDELITY', '(default)')}"
    )
    step_costs(args.steps, args.repeat, args.method)
    if not args.skip_e2e:
        end_to_end(args.e2e_repeat, args.prompts, args.new_tokens, args.method, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
