"""A recurring job driven by the V100 trace through the real server and client.

The job is the reference's `run_single.py` default: librispeech / deepspeech2 / adamw, target
WER 40.0, 16 epochs at most, default batch size 192, eta 0.5, beta 2, seed 1, and
2 * |batch sizes| * |power limits| recurrences.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from bso_helpers import BACKENDS, Database, ServerProcess
from trace_sim import ETA, GPU_MAX_POWER, MAX_EPOCHS, Trace, job_spec, load_trace, simulate


@pytest.fixture
def trace(shared_data: Path) -> Trace:
    return load_trace(shared_data)


def expected_best_batch_size(trace: Trace) -> int:
    """Cheapest expected cost to reach the target, computed straight from the trace."""
    best, best_cost = 0, math.inf
    for bs in trace.batch_sizes:
        t, e = trace.epoch[bs]
        per_epoch = ETA * e + (1 - ETA) * GPU_MAX_POWER * t
        runs = trace.target_epochs[bs]
        if any(math.isnan(x) or x > MAX_EPOCHS for x in runs):
            continue  # Some training paths never reach the target.
        cost = per_epoch * sum(runs) / len(runs)
        if cost < best_cost:
            best, best_cost = bs, cost
    return best


def test_trace_facts(trace: Trace) -> None:
    assert trace.batch_sizes == [2, 4, 8, 12, 16, 24, 32, 48, 56, 64, 72, 96, 128, 156, 192]
    assert trace.num_power_limits == 7
    # 48 is cheapest on average (8.65e6 J-equivalent), ahead of 56 (8.83e6) and 32 (8.88e6).
    assert expected_best_batch_size(trace) == 48


@pytest.mark.timeout(900)
@pytest.mark.parametrize("database", BACKENDS, indirect=True)
def test_converges_and_survives_sigkill(
    trace: Trace, database: Database, tmp_path: Path, sim_gpus: object
) -> None:
    sim_gpus("V100")  # type: ignore[operator]
    recurrences = 2 * len(trace.batch_sizes) * trace.num_power_limits  # 210
    if database.backend == "postgres":
        database.migrate()

    # Uninterrupted run.
    server = ServerProcess(database.url).start()
    try:
        plain = simulate(server.base_url, job_spec("librispeech-a", trace), trace, recurrences)
    finally:
        server.stop()

    # The same job (same seeds) under another id, with the server SIGKILLed mid-trial twice:
    # once while pruning, once during Thompson sampling.
    kills = {(3, 2), (150, 1)}
    server = ServerProcess(database.url).start()

    def crash(recurrence: int, epoch: int) -> None:
        if (recurrence, epoch) in kills:
            server.kill()
            server.start()

    try:
        crashed = simulate(
            server.base_url,
            job_spec("librispeech-b", trace),
            trace,
            recurrences,
            after_report=crash,
        )
    finally:
        server.stop()

    assert crashed.batch_sizes == plain.batch_sizes
    assert crashed.reports == plain.reports
    counts = {
        job: database.query(
            "SELECT count(*), sum(report_count), sum(CASE WHEN status = 'Succeeded' "
            "THEN 1 ELSE 0 END) FROM bso_trial WHERE job_id = :j",
            j=job,
        )[0]
        for job in ("librispeech-a", "librispeech-b")
    }
    assert (
        counts["librispeech-a"]
        == counts["librispeech-b"]
        == (
            recurrences,
            plain.reports,
            recurrences,
        )
    )

    # Convergence: the bandit settles on the batch size the trace says is cheapest.
    best = expected_best_batch_size(trace)
    tail = plain.batch_sizes[-60:]
    assert Counter(tail).most_common(1)[0][0] == best, Counter(tail)
    assert tail.count(best) >= 0.5 * len(tail), Counter(tail)
