"""The Perseus client: a training-loop callback that runs the server's frequency plan.

Unlike zeus 0.8 (whose client could not run: `docs/reference-differences.md`, bug 6), this
client works end to end, reports what it measured, and does not need PyTorch:

- The job id is taken from `job_id` if given; else, when `torch.distributed` is initialised,
  rank 0 registers the job and broadcasts the id; else rank 0 registers and the other ranks
  ask the server for the newest job with the same `job_metadata` (which must then be unique to
  this run).
- Every iteration, `on_step_end` posts the iteration's `ProfilingResult` (time and energy per
  instruction, measured with the GPU's energy counter and the backend clock) and fetches the
  next schedule. Fetching waits until every rank finished the iteration.
- A server that cannot be reached, or refuses a request, raises `ZeusPerseusServerError`
  (also a `RuntimeError`, which the client raised before). No request is repeated but the
  search of the other ranks for the job, which waits `timeout` for rank 0 to register it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from typing import Any, Optional

from zeus.callback import Callback
from zeus.device import get_gpus
from zeus.exception import ZeusBaseError
from zeus.optimizer.perseus.common import (
    GET_FREQUENCY_SCHEDULE_URL,
    GET_JOB_ID_URL,
    REGISTER_JOB_URL,
    REGISTER_RANK_URL,
    REPORT_PROFILING_RESULT_URL,
    FrequencySchedule,
    JobInfo,
    ProfilingResult,
    RankInfo,
)
from zeus.optimizer.perseus.frequency_controller import FrequencyController
from zeus.util import framework, http
from zeus.util.framework import imported_sync
from zeus.util.logging import get_logger

logger = get_logger(__name__)

__all__ = ["PerseusOptimizer", "ZeusPerseusServerError"]

# A rank looking for the job rank 0 registers asks again this often until it is there.
_JOB_LOOKUP_INTERVAL_S = 0.05


class ZeusPerseusServerError(ZeusBaseError, RuntimeError):
    """The Perseus server could not be reached, refused a request, or answered nonsense.

    Also a `RuntimeError`: what the client raised for these before it had a class of its own,
    so code catching that keeps working.
    """


def _unreachable(failure: http.Failure) -> ZeusPerseusServerError:
    verb = "did not answer" if failure.timed_out else "cannot be reached"
    return ZeusPerseusServerError(
        f"Perseus server: {failure.method} {failure.url} {verb} "
        f"({type(failure.error).__name__}: {failure.error})"
    )


def _refused(failure: http.Failure) -> ZeusPerseusServerError:
    return ZeusPerseusServerError(
        f"Perseus server: {failure.method} {failure.path} failed ({failure.status}): {failure.text}"
    )


def _not_json(failure: http.Failure) -> ZeusPerseusServerError:
    return ZeusPerseusServerError(
        f"Perseus server: {failure.method} {failure.path} answered with non-JSON: "
        f"{failure.text[:200]!r}"
    )


def _schedule_refused(failure: http.Failure) -> ZeusPerseusServerError:
    return ZeusPerseusServerError(
        f"Perseus server: schedule request failed ({failure.status}): {failure.text}"
    )


_ERRORS = http.ErrorMap(transport=_unreachable, status=_refused, body=_not_json, success=(200,))
# Registering and reporting change the server's state, and a schedule request waits for the
# other ranks: none is repeated.
_SERVICE = http.Service("Perseus server", _ERRORS)
_SCHEDULES = dataclasses.replace(
    _SERVICE, errors=dataclasses.replace(_ERRORS, status=_schedule_refused)
)


class PerseusOptimizer(Callback):
    """Run each pipeline instruction at the frequency the Perseus server planned.

    Args:
        rank: Global rank.
        dp_rank: Data-parallel rank.
        pp_rank: Pipeline stage.
        tp_rank: Tensor-parallel rank.
        device_id: GPU index of this rank.
        dp_degree: Data-parallel degree.
        pp_degree: Number of pipeline stages.
        tp_degree: Tensor-parallel degree.
        world_size: Number of ranks (`dp * pp * tp`).
        server_url: Base URL of the server, e.g. `http://127.0.0.1:7787`.
        job_metadata: Free text appended to the job id.
        job_id: Join this registered job instead of registering one.
        blocking_power: Watts this GPU draws while waiting, reported to the server.
        wait_for_frequency: Block each instruction until its clock is applied (useful with
            the simulated GPU's virtual clock; on real GPUs the change overlaps the work).
        report_results: Post results and fetch a new schedule every iteration (needed by
            profiling schedulers); if false, the first schedule is replayed forever.
        timeout: Seconds to wait for the job id or for HTTP answers other than schedules
            (schedules may wait for slow ranks indefinitely).
        num_microbatches: Microbatches per iteration, sent with the job so that schedulers
            not configured with it (the default, `AllMaxFrequency`) can plan (not in the
            reference).

    """

    def __init__(
        self,
        rank: int,
        dp_rank: int,
        pp_rank: int,
        tp_rank: int,
        device_id: int,
        dp_degree: int,
        pp_degree: int,
        tp_degree: int,
        world_size: int,
        server_url: str,
        job_metadata: Optional[str] = None,
        *,
        job_id: Optional[str] = None,
        blocking_power: Optional[float] = None,
        wait_for_frequency: bool = False,
        report_results: bool = True,
        timeout: float = 60.0,
        num_microbatches: Optional[int] = None,
    ) -> None:
        """Register with the server, start the frequency controller, get the first plan.

        Raises:
            ZeusPerseusServerError: the server cannot be reached or refused a request.
            ValueError: a rank other than 0 has neither `job_id`, `torch.distributed` nor
                `job_metadata` to find the job by.

        """
        self.rank = rank
        self.dp_rank = dp_rank
        self.pp_rank = pp_rank
        self.tp_rank = tp_rank
        self.device_id = device_id
        self.world_size = world_size
        self.server_url = server_url.rstrip("/")
        self.blocking_power = blocking_power
        self.wait_for_frequency = wait_for_frequency
        self.report_results = report_results
        self.timeout = timeout
        self._http = http.open_client(self.server_url, timeout=timeout)

        self.gpus = get_gpus()
        mem = max(self.gpus.get_supported_memory_clocks(device_id))
        self.available_frequencies = sorted(
            self.gpus.get_supported_graphics_clocks(device_id, mem), reverse=True
        )
        job_info = JobInfo(
            pp_degree=pp_degree,
            dp_degree=dp_degree,
            tp_degree=tp_degree,
            world_size=world_size,
            job_metadata=job_metadata,
            num_microbatches=num_microbatches,
        )
        self.job_id = job_id if job_id is not None else self._get_job_id(job_info)
        self._post(
            REGISTER_RANK_URL.format(job_id=self.job_id),
            RankInfo(
                rank=rank,
                dp_rank=dp_rank,
                pp_rank=pp_rank,
                tp_rank=tp_rank,
                available_frequencies=self.available_frequencies,
            ),
        )
        self.frequency_controller = FrequencyController(device_id, self.gpus)
        self._schedule = self._fetch_schedule()
        self._pos = 0
        self._reset_measurements()

    # Server communication ------------------------------------------------------------------

    def _post(self, url: str, model: Any) -> Any:
        return _SERVICE.send_json(
            self._http,
            "POST",
            url,
            content=model.model_dump_json(),
            headers={"Content-Type": "application/json"},
        )

    def _get_job_id(self, job_info: JobInfo) -> str:
        if framework.process_group() is not None:
            job_id = framework.broadcast_object(
                self._register_job(job_info) if self.rank == 0 else None, rank=self.rank
            )
            assert isinstance(job_id, str)
            return job_id
        if self.rank == 0:
            return self._register_job(job_info)
        if not job_info.job_metadata:
            raise ValueError(
                "Without torch.distributed, ranks other than 0 find the job by job_metadata "
                "(or pass job_id); job_metadata is empty"
            )
        metadata = job_info.job_metadata

        def not_found(failure: http.Failure) -> ZeusPerseusServerError:
            return ZeusPerseusServerError(
                f"Perseus server: no job with metadata {metadata!r} "
                f"({failure.status}): {failure.text}"
            )

        # 404 until rank 0 has registered the job: asked again until `timeout` has passed.
        lookup = http.Service(
            "Perseus server",
            dataclasses.replace(_ERRORS, status=not_found),
            http.RetryPolicy(
                retries=None,
                max_elapsed_s=self.timeout,
                backoff=http.Backoff(first_s=_JOB_LOOKUP_INTERVAL_S, factor=1.0),
                statuses=frozenset({404}),
                failures=(),
                log_level=logging.DEBUG,
            ),
        )
        return lookup.send_json(
            self._http, "GET", GET_JOB_ID_URL, params={"job_metadata": metadata}
        )

    def _register_job(self, job_info: JobInfo) -> str:
        job_id = self._post(REGISTER_JOB_URL, job_info)
        if not isinstance(job_id, str):
            raise ZeusPerseusServerError(f"Perseus server returned a non-string job id: {job_id!r}")
        logger.info("Registered Perseus job %s", job_id)
        return job_id

    def _fetch_schedule(self) -> list[tuple[str, int]]:
        # No read timeout: the schedule comes once every rank has reported, however slow one
        # is.
        body = _SCHEDULES.send_json(
            self._http,
            "GET",
            GET_FREQUENCY_SCHEDULE_URL.format(job_id=self.job_id),
            params={"rank": self.rank},
            timeout=http.timeouts(None),
        )
        sched = FrequencySchedule.model_validate(body)
        if sched.rank != self.rank:
            raise ZeusPerseusServerError(
                f"Got the schedule of rank {sched.rank}, expected {self.rank}"
            )
        return list(sched.frequencies)

    # Measurement ---------------------------------------------------------------------------

    def _reset_measurements(self) -> None:
        self._times: dict[str, list[float]] = defaultdict(list)
        self._energies: dict[str, list[float]] = defaultdict(list)
        self._step_start: Optional[tuple[float, float]] = None
        self._instr_start: Optional[tuple[str, float, float]] = None

    def _sync(self) -> None:
        # Wait for queued GPU work so times and energies belong to the right instruction;
        # without a framework (e.g. the simulated GPU) there is nothing queued.
        sync = imported_sync()
        if sync is not None:
            sync(self.device_id)

    def _sample(self) -> tuple[float, float]:
        """(backend clock s, energy J) now."""
        return self.gpus.now(), self.gpus.get_total_energy_consumption(self.device_id) / 1000.0

    # Callback hooks ------------------------------------------------------------------------

    def on_step_begin(self) -> None:
        """Mark the iteration's start."""
        self._step_start = self._sample()

    def on_instruction_begin(self, name: str) -> None:
        """Apply the planned frequency of the next instruction, which must be `name`.

        Raises:
            RuntimeError: the plan has no more instructions, or the next one is not `name`.

        """
        self._sync()
        if self._pos >= len(self._schedule):
            raise RuntimeError(
                f"Rank {self.rank}: the schedule has fewer frequencies than expected "
                f"({len(self._schedule)})"
            )
        expected, freq = self._schedule[self._pos]
        if expected != name:
            raise RuntimeError(
                f"Rank {self.rank}: instruction {self._pos} is {name!r}, the schedule "
                f"expects {expected!r}"
            )
        self._pos += 1
        self.frequency_controller.set_frequency(freq)
        if self.wait_for_frequency:
            self.frequency_controller.wait()
        if self._step_start is None:
            self._step_start = self._sample()
        t, e = self._sample()
        self._instr_start = (name, t, e)

    def on_instruction_end(self, name: str) -> None:
        """Record the instruction's time and energy."""
        self._sync()
        if self._instr_start is None or self._instr_start[0] != name:
            raise RuntimeError(f"Rank {self.rank}: on_instruction_end({name!r}) without a begin")
        _, t0, e0 = self._instr_start
        t1, e1 = self._sample()
        self._times[name].append(t1 - t0)
        self._energies[name].append(e1 - e0)
        self._instr_start = None

    def on_step_end(self) -> None:
        """Check the plan was used up, report the iteration, fetch the next plan.

        Raises:
            RuntimeError: instructions of the plan were not run.

        """
        if self._pos != len(self._schedule):
            raise RuntimeError(
                f"Rank {self.rank}: {len(self._schedule) - self._pos} scheduled instructions "
                "were not run this iteration"
            )
        self._pos = 0
        if not self.report_results:
            self._reset_measurements()
            return
        t1, e1 = self._sample()
        t0, e0 = self._step_start if self._step_start is not None else (t1, e1)
        result = ProfilingResult(
            rank=self.rank,
            iter_time=[t1 - t0],
            iter_energy=[e1 - e0],
            time_breakdown={k: [v] for k, v in self._times.items()},
            energy_breakdown={k: [v] for k, v in self._energies.items()},
            blocking_power=self.blocking_power,
        )
        self.last_result = result
        self._post(REPORT_PROFILING_RESULT_URL.format(job_id=self.job_id), result)
        self._reset_measurements()
        self._schedule = self._fetch_schedule()

    @property
    def schedule(self) -> list[tuple[str, int]]:
        """The `(instruction, MHz)` plan of the current iteration."""
        return list(self._schedule)

    def close(self) -> None:
        """Restore the GPU clocks and close the HTTP client."""
        self.frequency_controller.end()
        self._http.close()

    def on_train_end(self) -> None:
        """Restore the GPU clocks."""
        self.close()
