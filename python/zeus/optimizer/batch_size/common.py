"""Models and URLs shared by the batch size optimizer client and server.

The JSON shapes match the reference Zeus 0.8 REST API field for field, so clients of either
server interoperate. Unknown JSON keys are ignored (pydantic's default), as the reference did.

Every field carries the range that both databases can store and that makes sense, as pydantic
constraints, so the server's OpenAPI states them and a value outside answers 422 naming the
field on SQLite and PostgreSQL alike: integers fit PostgreSQL's 32-bit `integer` (SQLite would
take 64 bits, PostgreSQL fails beyond 31), strings have the column's length and no NUL
character (PostgreSQL's text types cannot hold one), the list of batch sizes is bounded, and
floats are bounded so that the Zeus cost computed from them stays finite.
"""

from __future__ import annotations

from typing import Annotated, List, Optional

from pydantic import BaseModel, Field, field_validator, model_validator

REGISTER_JOB_URL = "/jobs"
DELETE_JOB_URL = "/jobs"
GET_NEXT_BATCH_SIZE_URL = "/jobs/batch_size"
REPORT_RESULT_URL = "/report"
REPORT_END_URL = "/trials"

# Column widths of the server's schema.
MAX_JOB_ID_LEN = 400
MAX_JOB_ID_PREFIX_LEN = 300
MAX_GPU_MODEL_LEN = 300
# The largest value of PostgreSQL's `integer`, the type of the integer columns.
INT32_MAX = 2**31 - 1
# Candidate batch sizes of one job. Each prediction reads them all; a job registered with a
# million of them (7.9 MB) held the event loop for 0.19 s per prediction.
MAX_BATCH_SIZES = 1024
# Bounds of the measured quantities, far beyond any real job, that keep the Zeus cost
# (eta * energy + (1 - eta) * max_power * time) and the bandit's sums finite.
MAX_POWER_WATTS = 1e9
MAX_SECONDS = 1e12
MAX_JOULES = 1e21
MAX_MAGNITUDE = 1e30

# No NUL character: PostgreSQL's text types refuse it (SQLite would store it).
_NO_NUL = r"^[^\x00]*$"

JobId = Annotated[str, Field(min_length=1, max_length=MAX_JOB_ID_LEN, pattern=_NO_NUL)]
# A client's name for one prediction request, so that a retry gets the same trial: printable
# ASCII without blanks (a UUID's hex, say), at most MAX_REQUEST_ID_LEN characters.
MAX_REQUEST_ID_LEN = 64
RequestId = Annotated[str, Field(min_length=1, max_length=MAX_REQUEST_ID_LEN, pattern=r"^[!-~]+$")]
PositiveInt32 = Annotated[int, Field(ge=1, le=INT32_MAX)]
NonNegInt32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
BoundedFloat = Annotated[float, Field(ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE, allow_inf_nan=False)]


class JobParams(BaseModel):
    """What the user decides about a recurring job.

    Attributes:
        job_id: Unique id of the job (a recurrence shares it).
        job_id_prefix: Prefix of server-generated job ids; `job_id` must start with it.
        batch_sizes: Candidate batch sizes (stored sorted, each positive, no duplicates, at
            most `MAX_BATCH_SIZES`).
        default_batch_size: Batch size the first trial uses; must be in `batch_sizes`.
        eta_knob: Weight of energy against time in the cost, in [0, 1].
        beta_knob: Early-stop threshold multiplier on the best cost so far (> 0), or None to
            disable early stopping.
        target_metric: Validation metric that counts as converged.
        higher_is_better_metric: Whether a larger metric is better.
        max_epochs: Epochs after which a trial stops as failed.
        num_pruning_rounds: Rounds of pruning exploration before Thompson sampling.
        window_size: Number of most recent results per batch size the bandit fits on; <= 0 means
            all results.
        mab_prior_mean: Mean of the Gaussian prior of each arm.
        mab_prior_precision: Precision of that prior (0 = flat).
        mab_num_explorations: Pulls of each arm before sampling starts.
        mab_seed: Seed of the bandit's random generator; None draws one from the OS.

    """

    job_id: JobId
    job_id_prefix: str = Field(min_length=1, max_length=MAX_JOB_ID_PREFIX_LEN, pattern=_NO_NUL)
    batch_sizes: List[PositiveInt32] = Field(
        min_length=1, max_length=MAX_BATCH_SIZES, json_schema_extra={"uniqueItems": True}
    )
    default_batch_size: PositiveInt32
    eta_knob: float = Field(default=0.5, ge=0.0, le=1.0)
    beta_knob: Optional[float] = Field(default=2.0, gt=0.0, le=MAX_MAGNITUDE, allow_inf_nan=False)
    target_metric: BoundedFloat = 0.5
    higher_is_better_metric: bool = True
    max_epochs: PositiveInt32 = 100
    num_pruning_rounds: NonNegInt32 = 2
    window_size: int = Field(default=10, ge=-INT32_MAX - 1, le=INT32_MAX)
    mab_prior_mean: BoundedFloat = 0.0
    mab_prior_precision: float = Field(default=0.0, ge=0.0, le=MAX_MAGNITUDE, allow_inf_nan=False)
    mab_num_explorations: NonNegInt32 = 2
    mab_seed: Optional[int] = Field(default=None, ge=0, lt=2**63)

    @field_validator("batch_sizes")
    @classmethod
    def _check_batch_sizes(cls, bss: list[int]) -> list[int]:
        if len(set(bss)) != len(bss):
            raise ValueError(f"batch_sizes has duplicates: {bss}")
        return sorted(bss)

    @model_validator(mode="after")
    def _check_default(self) -> JobParams:
        if self.default_batch_size not in self.batch_sizes:
            raise ValueError(
                f"default_batch_size {self.default_batch_size} is not in batch_sizes "
                f"{self.batch_sizes}"
            )
        return self


class GpuConfig(BaseModel):
    """The GPUs a job runs on, reported by the client.

    Attributes:
        max_power: Sum of the maximum power limits of the job's GPUs, watts.
        number_of_gpus: How many GPUs the job uses.
        gpu_model: GPU name, e.g. "Tesla V100".

    """

    max_power: float = Field(gt=0.0, le=MAX_POWER_WATTS, allow_inf_nan=False)
    number_of_gpus: PositiveInt32
    gpu_model: str = Field(min_length=1, max_length=MAX_GPU_MODEL_LEN, pattern=_NO_NUL)


class JobSpec(JobParams):
    """A job as the user specifies it: `job_id` is optional (the server then generates one)."""

    job_id: Optional[JobId] = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _check_prefix(self) -> JobSpec:
        if self.job_id is not None and not self.job_id.startswith(self.job_id_prefix):
            raise ValueError(
                f"job_id {self.job_id!r} does not start with job_id_prefix {self.job_id_prefix!r}"
            )
        return self


class JobSpecFromClient(JobSpec, GpuConfig):
    """The registration body the client sends: the job spec plus its GPU configuration."""


class CreatedJob(JobParams, GpuConfig):
    """A registered job, with its (possibly server-generated) `job_id`."""


class TrialId(BaseModel):
    """One trial (one training run) of a job.

    Attributes:
        job_id: The job.
        batch_size: Batch size of the trial.
        trial_number: Number of the trial within the job, from 1.

    """

    job_id: JobId
    batch_size: PositiveInt32
    trial_number: PositiveInt32


class TrainingResult(TrialId):
    """A trial's progress, reported after each evaluation.

    Attributes:
        time: Seconds spent by the trial so far (cumulative).
        energy: Joules spent by the trial so far (cumulative).
        metric: Latest validation metric.
        current_epoch: Epochs done so far. The server records the first report of each
            epoch of a trial; another report of that epoch (a client retrying after a lost
            answer) gets the same decision and changes nothing, and a report of an earlier
            epoch is refused (409).

    """

    time: float = Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)
    energy: float = Field(ge=0.0, le=MAX_JOULES, allow_inf_nan=False)
    metric: BoundedFloat
    current_epoch: NonNegInt32


class ReportResponse(BaseModel):
    """The server's answer to a report.

    Attributes:
        stop_train: Whether training must stop now.
        converged: Whether the trial reached the target within the cost bound.
        message: Why.

    """

    stop_train: bool
    converged: bool
    message: str
