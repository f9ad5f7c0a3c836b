"""Many jobs, and many trials of one job, reporting at once to two server processes sharing
one database: every report is recorded exactly once and trial numbers never repeat.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from bso_helpers import BACKENDS, Database, ServerProcess
from trace_sim import SimResult, Trace, simulate
from zeus.optimizer.batch_size import JobSpec

# A small synthetic workload: four batch sizes; 64 is cheapest; 256 sometimes never converges.
TRACE = Trace(
    batch_sizes=[32, 64, 128, 256],
    epoch={32: (30.0, 6000.0), 64: (18.0, 4000.0), 128: (14.0, 3500.0), 256: (12.0, 3300.0)},
    target_epochs={32: [3.0, 4.0], 64: [3.0, 4.0], 128: [5.0, 6.0], 256: [8.0, float("nan")]},
    num_power_limits=1,
)


def spec(job_id: str) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        job_id_prefix="conc",
        batch_sizes=TRACE.batch_sizes,
        default_batch_size=128,
        eta_knob=0.5,
        beta_knob=2.0,
        target_metric=40.0,
        higher_is_better_metric=False,
        max_epochs=16,
        window_size=4,
        mab_seed=7,
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("database", BACKENDS, indirect=True)
def test_concurrent_jobs_and_trials_are_recorded_exactly_once(
    database: Database, sim_gpus: Any
) -> None:
    sim_gpus("A40")
    if database.backend == "postgres":
        database.migrate()
    servers = [ServerProcess(database.url).start() for _ in range(2)]
    try:
        jobs = 32
        recurrences = 6
        shared_workers, shared_recurrences = 8, 5
        lock = threading.Lock()
        results: dict[str, list[SimResult]] = {}

        def run(i: int) -> None:
            # Jobs 0..31 alone; workers 32.. share job "conc-shared" (concurrent recurrences).
            shared = i >= jobs
            job_id = "conc-shared" if shared else f"conc-{i}"
            url = servers[i % 2].base_url
            n = shared_recurrences if shared else recurrences
            res = simulate(url, spec(job_id), TRACE, n, seed=i)
            with lock:
                results.setdefault(job_id, []).append(res)

        with ThreadPoolExecutor(jobs + shared_workers) as pool:
            list(pool.map(run, range(jobs + shared_workers)))
    finally:
        for s in servers:
            s.stop()

    assert len(results) == jobs + 1
    rows = database.query(
        "SELECT job_id, count(*), min(trial_number), max(trial_number), "
        "count(DISTINCT trial_number), sum(report_count), "
        "sum(CASE WHEN status = 'Succeeded' THEN 1 ELSE 0 END) "
        "FROM bso_trial GROUP BY job_id"
    )
    by_job = {r[0]: r[1:] for r in rows}
    assert set(by_job) == set(results)
    for job_id, sims in results.items():
        trials = sum(len(s.batch_sizes) for s in sims)
        reports = sum(s.reports for s in sims)
        assert by_job[job_id] == (trials, 1, trials, trials, reports, trials), job_id
    next_numbers = database.query("SELECT job_id, next_trial_number FROM bso_job")
    assert all(n == by_job[j][0] + 1 for j, n in next_numbers)
