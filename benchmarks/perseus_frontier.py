"""Time to compute the Perseus time–energy frontier: zeus (Rust core) vs lowtime.

Input: a 4-stage x 8-microbatch synchronous 1F1B pipeline (64 instructions), 10 frequencies
per instruction, from the simulated GPU's model (time grows as 1/f for the compute-bound 70 %,
dynamic power falls as f^3). Both solvers get the same integer-quantised durations and the
same cost function per instruction (the lower convex envelope of its options), so their cost
curves must agree; the script checks that too.

Run: `python benchmarks/perseus_frontier.py [--divisor 500] [--repeat 3]`
(`pip install lowtime` for the comparison; without it only zeus is timed). The figures depend
on how `zeus._core` was built: `scripts/dev-build --release` for release numbers.
"""

from __future__ import annotations

import argparse
import math
import time

from zeus import _core

FORWARD_WORK = [0.9, 1.0, 1.2, 0.8]
COMPUTE_BOUND = 0.7
DYNAMIC_W = 172.5
CLOCKS = [1.0 - 0.88 * k / 9 for k in range(10)]


def problem(divisor: int):
    instrs, edges = _core.perseus.pipeline_1f1b(4, 8)
    raw = []
    for stage, _, kind in instrs:
        work = FORWARD_WORK[stage] * (1.0 if kind == "forward" else 2.0)
        opts = []
        for f in CLOCKS:
            t = work * (COMPUTE_BOUND / f + 1.0 - COMPUTE_BOUND)
            opts.append((t, t * DYNAMIC_W * f**3))
        raw.append(opts)
    t_allmax = _core.perseus.makespan(len(instrs), edges, [o[0][0] for o in raw])
    unit = t_allmax / divisor
    # Integer durations for both solvers: k units.
    quant = [[(math.ceil(t / unit), e) for t, e in opts] for opts in raw]
    return instrs, edges, quant, unit


def run_zeus(instrs, edges, quant, unit):
    options = [[(k * unit, e) for k, e in opts] for opts in quant]
    t0 = time.perf_counter()
    f = _core.perseus.compute_frontier(len(instrs), edges, options, unit)
    return time.perf_counter() - t0, dict(zip(f.time_units, f.costs))


def run_lowtime(instrs, edges, quant, unit):
    import networkx as nx
    from lowtime.cost_model import CostModel
    from lowtime.operation import (
        CandidateExecutionOptions,
        DummyOperation,
        ExecutionOption,
        Operation,
        OperationSpec,
    )
    from lowtime.solver import PhillipsDessouky

    class Envelope(CostModel):
        """The lower convex envelope of the options, as zeus uses."""

        def __init__(self, pts):
            best = {}
            for k, e in pts:
                best[k] = min(e, best.get(k, math.inf))
            pareto = []
            for k in sorted(best):
                if not pareto or best[k] < pareto[-1][1]:
                    pareto.append((k, best[k]))
            hull = []
            for p in pareto:
                while len(hull) >= 2:
                    (ax, ay), (bx, by) = hull[-2], hull[-1]
                    if (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax) <= 0:
                        hull.pop()
                    else:
                        break
                hull.append(p)
            self.hull = hull

        def __call__(self, q):
            h = self.hull
            if q <= h[0][0]:
                return h[0][1]
            for (x0, y0), (x1, y1) in zip(h, h[1:]):
                if q <= x1:
                    return y0 + (y1 - y0) * (q - x0) / (x1 - x0)
            return h[-1][1]

    t_build = time.perf_counter()
    dag = nx.DiGraph()
    n = len(instrs)
    has_pred, has_succ = [False] * n, [False] * n
    for i, opts in enumerate(quant):
        # lowtime floors real_time / unit_time; (k + 0.5) units floor to k.
        cands = CandidateExecutionOptions(
            options=[ExecutionOption((k + 0.5) * unit, unit, e, j) for j, (k, e) in enumerate(opts)]
        )
        dag.add_node(i + 2, op=Operation(spec=OperationSpec(cands, Envelope(opts))))
    dag.add_node(0, op=DummyOperation())
    dag.add_node(1, op=DummyOperation())
    for a, b in edges:
        dag.add_edge(a + 2, b + 2)
        has_succ[a] = has_pred[b] = True
    for i in range(n):
        if not has_pred[i]:
            dag.add_edge(0, i + 2)
        if not has_succ[i]:
            dag.add_edge(i + 2, 1)
    dag.graph["source_node"] = 0
    dag.graph["sink_node"] = 1
    solver = PhillipsDessouky(dag)
    t0 = time.perf_counter()
    curve = {}
    for res in solver.run():
        curve[res.quant_time] = res.cost
    t1 = time.perf_counter()
    return t1 - t0, t0 - t_build, curve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--divisor", type=int, default=500, help="unit_time = T_allmax / divisor")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    instrs, edges, quant, unit = problem(args.divisor)
    ours = [run_zeus(instrs, edges, quant, unit) for _ in range(args.repeat)]
    ours_t = min(t for t, _ in ours)
    curve = ours[0][1]
    print(f"4x8 pipeline, 10 frequencies, unit_time = T_allmax/{args.divisor} = {unit:.5f} s")
    print(f"zeus (Rust core): {ours_t * 1e3:10.2f} ms  ({len(curve)} frontier points)")
    try:
        import lowtime  # noqa: F401
    except ImportError:
        print("lowtime: not installed (pip install lowtime)")
        return
    lt = [run_lowtime(instrs, edges, quant, unit) for _ in range(max(1, args.repeat // 3))]
    lt_t = min(t for t, _, _ in lt)
    lt_curve = lt[0][2]
    print(
        f"lowtime:          {lt_t * 1e3:10.2f} ms  ({len(lt_curve)} points; DAG build "
        f"{lt[0][1] * 1e3:.1f} ms not counted)"
    )
    print(f"speed-up: x{lt_t / ours_t:.1f}")
    common = sorted(set(curve) & set(lt_curve))
    worst = max(abs(curve[t] - lt_curve[t]) / max(1.0, abs(curve[t])) for t in common)
    print(f"cost curves: {len(common)} common times, max relative difference {worst:.2e}")


if __name__ == "__main__":
    main()
