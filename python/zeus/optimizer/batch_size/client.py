"""The batch size optimizer client (a training-loop callback).

It asks the server which batch size to train with and reports each epoch's cumulative time and
energy.

Typical use (rank 0 of a job, or a single-GPU job):

    monitor = ZeusMonitor(gpu_indices=[0])
    bso = BatchSizeOptimizer(monitor, "http://bso:8000", JobSpec(job_id_prefix="mnist", ...))
    batch_size = bso.get_batch_size()
    bso.on_train_begin()
    for epoch in range(max_epochs):
        train_one_epoch(batch_size)
        bso.on_evaluate(validate())   # raises ZeusBSOTrainFailError when the trial fails

Distributed jobs: only rank 0 talks to the server. Other ranks receive the batch size, and at
every `on_evaluate` rank 0's stop decision, through `torch.distributed` (a broadcast from rank
0) when the default process group is initialised; every rank must then call `get_batch_size`
and `on_evaluate` at the same points. Without `torch.distributed`, a rank other than 0 takes
its batch size from the `ZEUS_BSO_BATCH_SIZE` environment variable (set it from rank 0's
`get_batch_size()` in your launcher) and `on_evaluate` is a no-op there; stopping those ranks is
then the launcher's job.

Failures are retried with exponential back-off where repeating the request is safe: any
connection error or timeout for the requests the server treats as idempotent (a report, which
it records once per epoch; ending a trial; registering a job under a given `job_id`; asking for
a batch size, which starts a trial, under a `request_id` the client makes up once, so a repeat
gets that trial), and for registering with a generated id only a failure to connect, where the
request never reached the server. Any other failure, and
any non-2xx answer, raises `ZeusBSORuntimError`. Requests carry `Authorization: Bearer
$ZEUS_BSO_TOKEN` when that variable is set. The requests go through `zeus.util.http`; this
module declares only the retry policy and the error map above.
"""

from __future__ import annotations

import atexit
import logging
import os
import uuid
from typing import Any, Callable, Optional

import httpx

from zeus.callback import Callback
from zeus.device import get_gpus
from zeus.optimizer.batch_size.common import (
    GET_NEXT_BATCH_SIZE_URL,
    REGISTER_JOB_URL,
    REPORT_END_URL,
    REPORT_RESULT_URL,
    CreatedJob,
    JobSpec,
    JobSpecFromClient,
    ReportResponse,
    TrainingResult,
    TrialId,
)
from zeus.optimizer.batch_size.exceptions import (
    ZeusBSOBadOperationError,
    ZeusBSOConfigError,
    ZeusBSOOperationOrderError,
    ZeusBSORuntimError,
    ZeusBSOTrainFailError,
)
from zeus.util import framework, http

logger = logging.getLogger(__name__)

# Measurement window the client opens around each epoch (the reference misspelled it).
WINDOW_NAME = "BatchSizeOptimizerClient"
BATCH_SIZE_ENV = "ZEUS_BSO_BATCH_SIZE"
TOKEN_ENV = "ZEUS_BSO_TOKEN"


class BatchSizeOptimizer(Callback):
    """Client of the batch size optimizer server for one training run (one trial)."""

    def __init__(
        self,
        monitor: Any,
        server_url: str,
        job: JobSpec,
        rank: int = 0,
        *,
        timeout: float = 10.0,
        max_retries: int = 5,
        backoff: float = 0.2,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        """Register the job with the server (rank 0 only).

        Args:
            monitor: A `ZeusMonitor` measuring the job's GPUs (`gpu_indices`).
            server_url: Base URL of the server, e.g. `http://127.0.0.1:8000`.
            job: The job's specification.
            rank: This process's rank; only rank 0 talks to the server.
            timeout: Seconds each HTTP request may take.
            max_retries: Retries of a failed request (see the module docstring for which).
            backoff: First retry delay in seconds; it doubles each retry.
            transport: httpx transport override (tests).

        Raises:
            ZeusBSOConfigError: no GPU is visible, or the monitor measures none.
            ZeusBSORuntimError: the server refused the registration.

        """
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.monitor = monitor
        self.server_url = server_url
        self.rank = rank
        self.max_retries = max_retries
        self.backoff = backoff
        # Every call says whether the server takes a repeat of it as the request itself
        # (`idempotent=`); a failure to connect is repeated for any request, as it never
        # arrived. Any answer is final: the server's statuses say what is wrong, not "later".
        self._service = http.Service(
            "Zeus batch size optimizer server",
            http.ErrorMap(transport=self._unreachable, status=self._refused),
            http.RetryPolicy(
                retries=max_retries,
                backoff=http.Backoff(first_s=backoff),
                statuses=frozenset(),
                failures=http.lost_answer_failures(),
                unsent_failures=http.never_sent_failures(),
            ),
        )
        self.current_batch_size = 0
        self.trial_number = 0
        self.cur_epoch = 0
        self.training_finished = False
        self.consumed_time = 0.0
        self.consumed_energy = 0.0
        self._window_open = False
        self._atexit_hook: Optional[Callable[[], None]] = None

        gpus = get_gpus(ensure_homogeneous=True)
        if len(gpus) == 0:
            raise ZeusBSOConfigError("No GPUs detected; the batch size optimizer needs one.")
        gpu_indices = list(getattr(monitor, "gpu_indices", []))
        if not gpu_indices:
            raise ZeusBSOConfigError("The monitor measures no GPU (empty gpu_indices).")
        _min_mw, max_mw = gpus.get_power_management_limit_constraints(gpu_indices[0])
        self.job = JobSpecFromClient.model_validate(
            {
                **job.model_dump(),
                "max_power": (max_mw // 1000) * len(gpu_indices),
                "number_of_gpus": len(gpu_indices),
                "gpu_model": gpus.get_name(gpu_indices[0]),
            }
        )

        self._http = http.open_client(
            server_url,
            timeout=timeout,
            token=http.lookup_token(None, TOKEN_ENV),
            transport=transport,
        )
        if self.rank == 0:
            # With its job_id given, a registration repeated after a lost answer finds the
            # job registered with the same configuration (200); a generated id would not.
            resp = self._request(
                "POST",
                REGISTER_JOB_URL,
                idempotent=self.job.job_id is not None,
                json=self.job.model_dump(mode="json"),
            )
            self.job = JobSpecFromClient.model_validate(
                CreatedJob.model_validate(resp.json()).model_dump()
            )
            logger.info("Registered job %s", self.job.job_id)

    # -- HTTP ---------------------------------------------------------------------------------

    def _request(self, method: str, url: str, *, idempotent: bool, **kwargs: Any) -> httpx.Response:
        """Send a request, retrying failures where that is safe.

        Args:
            method: HTTP method.
            url: Path on the server.
            idempotent: Whether the server treats a repeat of the request as the request
                itself, so that it may be retried even when it may have reached the server.
            **kwargs: Passed to `httpx.Client.build_request`.

        Raises:
            ZeusBSORuntimError: no answer after the retries, or a non-2xx answer.

        """
        return self._service.send(self._http, method, url, idempotent=idempotent, **kwargs)

    def _unreachable(self, failure: http.Failure) -> ZeusBSORuntimError:
        if failure.retryable:
            return ZeusBSORuntimError(
                f"Cannot reach the Zeus server at {self.server_url} after "
                f"{failure.attempts} attempts: {failure.error!r}"
            )
        return ZeusBSORuntimError(
            f"Request {failure.method} {failure.path} failed: {failure.error!r}"
        )

    @staticmethod
    def _refused(failure: http.Failure) -> ZeusBSORuntimError:
        return ZeusBSORuntimError(
            f"Zeus server returned status code {failure.status}: {failure.text}"
        )

    # -- API ----------------------------------------------------------------------------------

    def get_batch_size(self) -> int:
        """Return the batch size of this run (asked once from the server, then cached).

        Raises:
            ZeusBSOBadOperationError: a rank other than 0 without torch.distributed and without
                `ZEUS_BSO_BATCH_SIZE`.
            ZeusBSORuntimError: the server failed or answered a batch size outside the job's.

        """
        if self.current_batch_size:
            return self.current_batch_size
        if self.rank == 0:
            # Each prediction starts a trial; under one request_id, a retry gets that trial.
            params = {"job_id": self.job.job_id, "request_id": uuid.uuid4().hex}
            resp = self._request("GET", GET_NEXT_BATCH_SIZE_URL, idempotent=True, params=params)
            trial = TrialId.model_validate(resp.json())
            if trial.batch_size not in self.job.batch_sizes:
                raise ZeusBSORuntimError(
                    f"Zeus server returned batch size {trial.batch_size}, not one of the "
                    f"job's {self.job.batch_sizes}."
                )
            self.current_batch_size = trial.batch_size
            self.trial_number = trial.trial_number
            self._register_atexit(trial)
            framework.broadcast_object((trial.batch_size, trial.trial_number), rank=self.rank)
            return self.current_batch_size
        if framework.process_group() is not None:
            bs, number = framework.broadcast_object(None, rank=self.rank)
            self.current_batch_size, self.trial_number = int(bs), int(number)
            return self.current_batch_size
        raw = os.environ.get(BATCH_SIZE_ENV)
        if raw is None:
            raise ZeusBSOBadOperationError(
                f"Only rank 0 asks the server for the batch size. Rank {self.rank} needs "
                f"torch.distributed initialised or {BATCH_SIZE_ENV} set to rank 0's batch size."
            )
        try:
            bs = int(raw)
        except ValueError:
            raise ZeusBSOConfigError(f"{BATCH_SIZE_ENV}={raw!r} is not an integer") from None
        if bs not in self.job.batch_sizes:
            raise ZeusBSOConfigError(
                f"{BATCH_SIZE_ENV}={bs} is not one of the job's batch sizes {self.job.batch_sizes}"
            )
        self.current_batch_size = bs
        return bs

    def _register_atexit(self, trial: TrialId) -> None:
        """Mark the trial failed on the server if the process exits before it ends."""

        def end_trial() -> None:
            try:
                self._request("PATCH", REPORT_END_URL, idempotent=True, json=trial.model_dump())
            except ZeusBSORuntimError as e:  # Exiting anyway; just say so.
                logger.warning("Could not end trial %d: %s", trial.trial_number, e)

        self._atexit_hook = end_trial
        atexit.register(end_trial)

    def _unregister_atexit(self) -> None:
        if self._atexit_hook is not None:
            atexit.unregister(self._atexit_hook)
            self._atexit_hook = None

    def on_train_begin(self) -> None:
        """Start measuring the first epoch."""
        self.training_finished = False
        if self.rank == 0:
            self.monitor.begin_window(WINDOW_NAME)
            self._window_open = True

    def on_evaluate(self, metric: float) -> None:
        """Report the epoch just finished and stop training if the server says so.

        Args:
            metric: Validation metric after this epoch.

        Raises:
            ZeusBSOOperationOrderError: called before `get_batch_size` or `on_train_begin`.
            ZeusBSOTrainFailError: the trial stopped without converging.

        """
        if not self.current_batch_size:
            raise ZeusBSOOperationOrderError("Call get_batch_size() before on_evaluate().")
        if self.training_finished:
            return
        if self.rank != 0:
            if framework.process_group() is not None:
                self._finish(*framework.broadcast_object(None, rank=self.rank))
            return
        if not self._window_open:
            raise ZeusBSOOperationOrderError("Call on_train_begin() before on_evaluate().")
        self.cur_epoch += 1
        measurement = self.monitor.end_window(WINDOW_NAME)
        self._window_open = False
        self.consumed_time += measurement.time
        self.consumed_energy += measurement.total_energy
        result = TrainingResult(
            job_id=self.job.job_id or "",
            batch_size=self.current_batch_size,
            trial_number=self.trial_number,
            time=self.consumed_time,
            energy=self.consumed_energy,
            metric=metric,
            current_epoch=self.cur_epoch,
        )
        # The server records a trial's report once per epoch, so a retry cannot count twice.
        resp = self._request("POST", REPORT_RESULT_URL, idempotent=True, json=result.model_dump())
        answer = ReportResponse.model_validate(resp.json())
        decision = (answer.stop_train, answer.converged, answer.message)
        framework.broadcast_object(decision, rank=self.rank)
        if not answer.stop_train:
            self.monitor.begin_window(WINDOW_NAME)
            self._window_open = True
            return
        self._unregister_atexit()
        self._finish(*decision)

    def _finish(self, stop: bool, converged: bool, message: str) -> None:
        if not stop:
            return
        self.training_finished = True
        if not converged:
            raise ZeusBSOTrainFailError(
                f"Train failed: {message} This batch size will not be selected again. "
                "Please re-launch the training"
            )

    def close(self) -> None:
        """Close the HTTP connection."""
        self._http.close()
