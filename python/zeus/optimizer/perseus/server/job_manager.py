"""Per-job state of the Perseus server: ranks, schedule rounds, results, idle cleanup.

A job goes through rounds. In round `n` every rank asks for its schedule; when all
`world_size` ranks have asked (and round `n - 1`'s results are all in), the scheduler's next
schedule is computed and every waiting rank gets its part. Each rank then posts one
`ProfilingResult` for round `n`; when all are in they are dumped and fed to the scheduler.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional

from zeus.optimizer.perseus.common import (
    FrequencySchedule,
    JobInfo,
    ProfilingResult,
    RankInfo,
    save_prof,
    save_ranks,
    save_sched,
)
from zeus.optimizer.perseus.server.config import PerseusSettings
from zeus.optimizer.perseus.server.scheduler import FrequencyScheduler
from zeus.util.logging import get_logger

logger = get_logger(__name__)


class PerseusError(Exception):
    """A request the server refuses; `status_code` is the HTTP status to answer with."""

    def __init__(self, status_code: int, detail: str) -> None:
        """Keep the status and the message."""
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


class UnknownJobError(PerseusError):
    """No such job (never registered, or dropped after being idle)."""

    def __init__(self, job_id: str) -> None:
        """Name the job."""
        super().__init__(404, f"Unknown job {job_id!r}")


def _scheduler_error(e: BaseException) -> PerseusError:
    """Scheduler failures reach every rank: `ValueError` as 400, anything else as 500.

    The answer says what failed, in one line; the traceback (with the server's install paths)
    goes to the server's log only.
    """
    logger.error(
        "Scheduler failed:\n%s", "".join(traceback.format_exception(type(e), e, e.__traceback__))
    )
    return PerseusError(400 if isinstance(e, ValueError) else 500, f"{type(e).__name__}: {e}")


@dataclass
class _Job:
    info: JobInfo
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    scheduler: Optional[FrequencyScheduler] = None
    error: Optional[PerseusError] = None
    last_active: float = field(default_factory=time.monotonic)
    # The round each rank is in: what its schedule requests get, until it reports a result for
    # it. So a request retried after a lost answer gets the same round again instead of
    # moving the rank on (which desynchronised the ranks and hung them).
    next_round: dict[int, int] = field(default_factory=dict)
    # The last round each rank was answered (a result for a round not yet answered is refused).
    answered: dict[int, int] = field(default_factory=dict)
    # round -> ranks that asked; round -> future of the schedules.
    requests: dict[int, set[int]] = field(default_factory=dict)
    schedules: dict[int, asyncio.Future] = field(default_factory=dict)
    # round -> rank -> result
    results: dict[int, dict[int, ProfilingResult]] = field(default_factory=dict)
    observed: int = -1  # last round whose results the scheduler has seen
    registered_order: int = 0


class JobManager:
    """All jobs of one server.

    Args:
        settings: Server settings (scheduler, its arguments, dump options, idle limits).

    """

    def __init__(self, settings: PerseusSettings) -> None:
        """Start with no jobs; `start()` launches the idle-job sweeper."""
        self.settings = settings
        self.jobs: dict[str, _Job] = {}
        self._cleanup_task: Optional[asyncio.Task] = None
        self._counter = 0
        self._closing = False

    # Lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the periodic sweep for idle jobs (needs a running event loop)."""
        if self._cleanup_task is None:
            self._cleanup_task = asyncio.get_running_loop().create_task(self._cleanup_loop())

    def fail_pending(self) -> None:
        """The server is going down: answer every waiting schedule request with 503, now.

        A request waits for the other ranks of its job, which may never come; without this a
        SIGTERM waited on them forever.
        """
        self._closing = True
        error = PerseusError(503, "the Perseus server is shutting down")
        for job in self.jobs.values():
            for fut in job.schedules.values():
                if not fut.done():
                    fut.set_exception(error)

    async def stop(self) -> None:
        """Stop the sweeper."""
        if self._cleanup_task is not None:
            self._cleanup_task.cancel()
            try:
                await self._cleanup_task
            except asyncio.CancelledError:
                pass
            self._cleanup_task = None

    async def _cleanup_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.cleanup_interval)
            self.cleanup_idle_jobs()

    def cleanup_idle_jobs(self) -> list[str]:
        """Drop jobs idle longer than `max_job_idle_time`; return their ids."""
        now = time.monotonic()
        dropped = [
            jid
            for jid, job in self.jobs.items()
            if now - job.last_active > self.settings.max_job_idle_time
        ]
        for jid in dropped:
            job = self.jobs.pop(jid)
            for fut in job.schedules.values():
                if not fut.done():
                    fut.set_exception(UnknownJobError(jid))
            logger.info("Dropped idle job %s", jid)
        return dropped

    # Requests --------------------------------------------------------------------------------

    def _job(self, job_id: str) -> _Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJobError(job_id)
        job.last_active = time.monotonic()
        return job

    def register_job(self, job_info: JobInfo) -> str:
        """Register a job and return its new id (unique among live jobs)."""
        job_info.set_job_id(self.settings.scheduler.__name__)
        base, n = job_info.job_id, 1
        while job_info.job_id in self.jobs:
            n += 1
            job_info.job_id = f"{base}+{n}"
        self._counter += 1
        self.jobs[job_info.job_id] = _Job(info=job_info, registered_order=self._counter)
        logger.info("Registered job %s", job_info.job_id)
        return job_info.job_id

    def find_job(self, job_metadata: str) -> str:
        """The most recently registered live job with this metadata.

        Raises:
            PerseusError: 404 if there is none.

        """
        matches = [j for j in self.jobs.values() if j.info.job_metadata == job_metadata]
        if not matches:
            raise PerseusError(404, f"No job with metadata {job_metadata!r}")
        return max(matches, key=lambda j: j.registered_order).info.job_id

    def _check_rank(self, job: _Job, rank: int) -> None:
        if not 0 <= rank < job.info.world_size:
            raise PerseusError(
                400,
                f"rank {rank} out of range for job {job.info.job_id!r} "
                f"(world size {job.info.world_size})",
            )

    async def register_rank(self, job_id: str, rank_info: RankInfo) -> None:
        """Register one rank; the last one to arrive creates the scheduler.

        Raises:
            PerseusError: unknown job (404), rank out of range (400), duplicate rank (409).

        """
        job = self._job(job_id)
        self._check_rank(job, rank_info.rank)
        info = job.info
        for name, value, degree in (
            ("pp_rank", rank_info.pp_rank, info.pp_degree),
            ("dp_rank", rank_info.dp_rank, info.dp_degree),
            ("tp_rank", rank_info.tp_rank, info.tp_degree),
        ):
            if value >= degree:
                raise PerseusError(400, f"{name} {value} out of range (degree {degree})")
        if rank_info.rank in job.ranks:
            raise PerseusError(409, f"rank {rank_info.rank} of job {job_id!r} already registered")
        if not rank_info.available_frequencies:
            raise PerseusError(400, f"rank {rank_info.rank} has no available frequencies")
        job.ranks[rank_info.rank] = rank_info
        job.next_round[rank_info.rank] = 0
        if len(job.ranks) < info.world_size:
            return
        rank_infos = [job.ranks[r] for r in sorted(job.ranks)]
        if self.settings.dump_data:
            await save_ranks(rank_infos, self._dump_dir(job))
        try:
            job.scheduler = self.settings.scheduler(
                info, rank_infos, self.settings, **self.settings.scheduler_args
            )
        except Exception as e:
            job.error = _scheduler_error(e)
        self._maybe_schedule(job)

    def _dump_dir(self, job: _Job) -> str:
        return f"{self.settings.dump_dir}/{job.info.job_id}"

    def _maybe_schedule(self, job: _Job) -> None:
        """Compute round `n`'s schedules once every rank asked and round `n-1` was observed."""
        n = job.observed + 1
        fut = job.schedules.get(n)
        if fut is None or fut.done():
            return
        if len(job.requests.get(n, ())) < job.info.world_size:
            return
        if len(job.ranks) < job.info.world_size:
            return
        if job.error is not None:
            fut.set_exception(job.error)
            return
        assert job.scheduler is not None
        try:
            schedules = job.scheduler.next_schedule()
            by_rank = {s.rank: s for s in schedules}
            missing = sorted(set(range(job.info.world_size)) - set(by_rank))
            if missing:
                raise RuntimeError(f"scheduler gave no schedule for ranks {missing}")
        except Exception as e:
            job.error = _scheduler_error(e)
            fut.set_exception(job.error)
            return
        fut.set_result(by_rank)

    async def get_frequency_schedule(self, job_id: str, rank: int) -> FrequencySchedule:
        """Wait until every rank asked for this round, then return `rank`'s schedule.

        Idempotent until the rank reports: asking again (a retry) returns the same round.

        Raises:
            PerseusError: unknown job (404), rank out of range or not registered (400),
                scheduler failure (400 for `ValueError`, else 500).

        """
        job = self._job(job_id)
        self._check_rank(job, rank)
        if rank not in job.ranks:
            raise PerseusError(400, f"rank {rank} of job {job_id!r} is not registered")
        if self._closing:
            raise PerseusError(503, "the Perseus server is shutting down")
        n = job.next_round[rank]
        job.requests.setdefault(n, set()).add(rank)
        fut = job.schedules.get(n)
        if fut is None:
            fut = job.schedules[n] = asyncio.get_running_loop().create_future()
        self._maybe_schedule(job)
        # shield: a client that disconnects must not cancel the round for the others.
        by_rank = await asyncio.shield(fut)
        job.answered[rank] = max(job.answered.get(rank, -1), n)
        return by_rank[rank]

    async def report_profiling_result(self, job_id: str, result: ProfilingResult) -> None:
        """Store a rank's result for the round it is in, and move it to the next round.

        The last result of a round triggers the dump and the scheduler's `observe`.

        Raises:
            PerseusError: unknown job (404), rank out of range or without a schedule (400),
                a second result for the same round (409).

        """
        job = self._job(job_id)
        self._check_rank(job, result.rank)
        n = job.next_round.get(result.rank, 0)
        answered = job.answered.get(result.rank, -1)
        if answered < 0:
            raise PerseusError(400, f"rank {result.rank} reported before receiving a schedule")
        if answered < n:
            # Its round n was not answered yet: this repeats the result for round n - 1.
            raise PerseusError(
                409, f"rank {result.rank} already reported a result for schedule {n - 1}"
            )
        round_results = job.results.setdefault(n, {})
        round_results[result.rank] = result
        job.next_round[result.rank] = n + 1
        if len(round_results) < job.info.world_size or job.observed != n - 1:
            return
        results = [round_results[r] for r in sorted(round_results)]
        fut = job.schedules[n]
        if self.settings.dump_data and fut.done() and fut.exception() is None:
            await save_prof(results, self._dump_dir(job), n)
            await save_sched(
                [fut.result()[r] for r in sorted(fut.result())], self._dump_dir(job), n
            )
        if job.scheduler is not None and job.error is None:
            try:
                job.scheduler.observe(results)
            except Exception as e:
                job.error = _scheduler_error(e)
        job.observed = n
        del job.results[n]
        # Old rounds are no longer needed.
        job.schedules.pop(n - 1, None)
        job.requests.pop(n - 1, None)
        self._maybe_schedule(job)


_global_job_manager: Optional[JobManager] = None


def init_global_job_manager(settings: PerseusSettings) -> JobManager:
    """Create the process-wide job manager (the reference's module-level API)."""
    global _global_job_manager
    _global_job_manager = JobManager(settings)
    return _global_job_manager


def get_global_job_manager() -> JobManager:
    """The process-wide job manager.

    Raises:
        RuntimeError: `init_global_job_manager` was not called.

    """
    if _global_job_manager is None:
        raise RuntimeError("init_global_job_manager was not called")
    return _global_job_manager
