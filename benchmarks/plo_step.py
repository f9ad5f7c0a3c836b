"""Cost of `GlobalPowerLimitOptimizer.on_step_begin` through the Python API.

Target: at most ~150 ns per call once the optimizer is `Done` (zeus 0.8: about 1.35 us), which
is the state training spends nearly all its steps in. `Profiling` is reported for reference: a
step there only counts down (the window and power-limit work happens once per limit).

Run: `ZEUS_GPU_BACKEND=sim ZEUS_SIM_CLOCK=virtual python benchmarks/plo_step.py`
(the script sets those itself when they are unset; a release build gives the real figures:
`scripts/dev-build --release`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import timeit

os.environ.setdefault("ZEUS_GPU_BACKEND", "sim")
os.environ.setdefault("ZEUS_SIM_CLOCK", "virtual")
os.environ.setdefault("ZEUS_STATE_DIR", tempfile.mkdtemp(prefix="zeus-bench-state-"))

from zeus.optimizer import GlobalPowerLimitOptimizer
from zeus.optimizer.power_limit import Done, Profiling


class NullMonitor:
    """Windows cost nothing here: the benchmark is about the hook itself."""

    gpu_indices = [0]

    def begin_window(self, key: str, sync_cuda: bool = True) -> None:
        pass

    def end_window(self, key: str, sync_cuda: bool = True, cancel: bool = False) -> None:
        pass


def per_call_ns(fn: object, number: int) -> float:
    """Best of 7 repeats, per call, in nanoseconds."""
    timer = timeit.Timer(fn)  # type: ignore[arg-type]
    return min(timer.repeat(repeat=7, number=number)) / number * 1e9


def main() -> int:
    n = 1_000_000
    baseline = per_call_ns(lambda: None, n)

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "profile.json")
        with open(path, "w") as f:
            json.dump({"measurements": [{"power_limit": 300, "energy": 1.0, "time": 1.0}]}, f)
        done = GlobalPowerLimitOptimizer(NullMonitor(), profile_path=path)
        assert isinstance(done.state, Done)
        hook = done.on_step_begin
        done_bound = per_call_ns(hook, n)
        # `plo.on_step_begin()` as a training loop writes it: attribute lookup + call.
        done_attr = (
            min(timeit.repeat("plo.on_step_begin()", globals={"plo": done}, repeat=7, number=n))
            / n
            * 1e9
        )
        done.close()

    prof = GlobalPowerLimitOptimizer(
        NullMonitor(), wait_steps=0, warmup_steps=0, profile_steps=10**9
    )
    prof.on_step_begin()
    assert isinstance(prof.state, Profiling)
    m = 200_000
    profiling = (
        min(timeit.repeat("plo.on_step_begin()", globals={"plo": prof}, repeat=7, number=m))
        / m
        * 1e9
    )
    prof.close()

    print(f"python {sys.version.split()[0]}; empty lambda call: {baseline:.0f} ns")
    print(f"Done      plo.on_step_begin(): {done_attr:7.0f} ns/call  (target <= 150 ns)")
    print(f"Done      bound hook call:     {done_bound:7.0f} ns/call")
    print(f"Profiling plo.on_step_begin(): {profiling:7.0f} ns/call")
    return 0 if done_attr <= 150 else 1


if __name__ == "__main__":
    sys.exit(main())
