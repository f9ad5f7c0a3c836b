"""The server's operations, each one database transaction.

Every operation is one transaction: a synchronous function over a `db.Tx` that
`db.Database.run` executes. On an existing job it first locks the job's row (see `db.py`),
reads what it needs, decides with the pure functions of `logic.py` and writes back.
Nothing about a job is kept in memory between requests, so any number of server processes can
share one database and a restarted server continues every job where it stopped.

Divergence from the reference (a bug fix): the best cost so far (`min_cost`, the base of the
early-stop threshold `beta_knob * min_cost`) and its batch size are updated only from trials
that converged within the bound. The reference also took them from trials that ended without
reaching the target, so a cheap failure could tighten the threshold and then early-stop
batch sizes that would have converged.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, Optional

import sqlalchemy as sa

from zeus.optimizer.batch_size.common import (
    CreatedJob,
    JobSpecFromClient,
    ReportResponse,
    TrainingResult,
    TrialId,
)
from zeus.optimizer.batch_size.server import logic
from zeus.optimizer.batch_size.server.db import Database, Statement, Tx
from zeus.optimizer.batch_size.server.errors import (
    ZeusBSOJobConfigMismatchError,
    ZeusBSONotFoundError,
    ZeusBSOServerBaseError,
    ZeusBSOValueError,
)
from zeus.optimizer.batch_size.server.schema import (
    STAGE_MAB,
    STAGE_PRUNING,
    STATUS_DISPATCHED,
    STATUS_FAILED,
    STATUS_SUCCEEDED,
    TRIAL_CONCURRENT,
    TRIAL_EXPLORATION,
    TRIAL_MAB,
    arms,
    jobs,
    trials,
)
from zeus.util.metric import zeus_cost

# Columns that make up a job's configuration (compared on re-registration).
_CONFIG_FIELDS = tuple(CreatedJob.model_fields)


def _job_config(row: Any) -> CreatedJob:
    data = {f: getattr(row, f) for f in _CONFIG_FIELDS}
    data["batch_sizes"] = json.loads(row.batch_sizes)
    return CreatedJob.model_validate(data)


class BsoService:
    """Job registration, batch size prediction and result reporting over one database."""

    def __init__(self, db: Database) -> None:
        """Use `db` (its schema must be migrated); compiles the statements of every request."""
        self.db = db
        db.prepare(STATEMENTS)

    # -- registration -------------------------------------------------------------------------

    async def register(self, spec: JobSpecFromClient) -> tuple[CreatedJob, bool]:
        """Register a job; returns it and whether it was created (False: identical re-register).

        Raises:
            ZeusBSOJobConfigMismatchError: `job_id` exists with a different configuration.

        """
        generate = spec.job_id is None
        for _ in range(20):
            job_id = f"{spec.job_id_prefix}-{secrets.token_hex(4)}" if generate else spec.job_id
            created = CreatedJob.model_validate({**spec.model_dump(), "job_id": job_id})
            values = created.model_dump()
            values["batch_sizes"] = json.dumps(created.batch_sizes)
            values.update(
                stage=STAGE_PRUNING,
                min_cost=None,
                min_cost_batch_size=created.default_batch_size,
                next_trial_number=1,
                rng_state=logic.new_rng_state(created.mab_seed),
                created_at=time.time(),
            )
            try:
                await self.db.run(_insert_job, values)
                return created, True
            except self.db.integrity_errors:
                if generate:
                    continue  # The random suffix collided; draw another.
            existing = await self.db.run(_read_job_config, job_id)
            if existing is None:  # Deleted in between: try to create it again.
                continue
            if existing != created:
                diff = sorted(
                    f for f in _CONFIG_FIELDS if getattr(existing, f) != getattr(created, f)
                )
                raise ZeusBSOJobConfigMismatchError(
                    f"Job({job_id}) is already registered with a different configuration "
                    f"(fields {diff} differ). Use a new job_id for a different configuration.",
                    *diff,
                )
            return existing, False
        raise ZeusBSOServerBaseError(f"Could not register a job with prefix {spec.job_id_prefix}")

    async def delete(self, job_id: str) -> None:
        """Delete a job with its trials and arms.

        Raises:
            ZeusBSONotFoundError: no such job.

        """
        await self.db.run(_delete_job, job_id)

    async def predict(self, job_id: str, request_id: Optional[str] = None) -> TrialId:
        """Start a new trial of `job_id` and return it (its batch size is the decision).

        With `request_id`, the client's name for this request, a repeat of the request (a
        retry after a lost answer) returns the trial it started instead of starting another.

        Raises:
            ZeusBSONotFoundError: unknown job.
            logic.NoConvergedBatchSizeError: pruning left no batch size.

        """
        return await self.db.run(_predict, job_id, request_id)

    async def report(self, result: TrainingResult) -> ReportResponse:
        """Record a trial's progress and tell the client whether to stop.

        Idempotent per (trial, epoch): the first report of an epoch is recorded; another one
        of the same epoch (a retry after a lost answer) changes nothing and gets the same
        decision, as does any report once the trial has ended.

        Raises:
            ZeusBSONotFoundError: unknown job or trial.
            ZeusBSOValueError: a batch size that is not the trial's, or an epoch before the
                last one recorded.

        """
        return await self.db.run(_report, result)

    async def end_trial(self, trial: TrialId) -> None:
        """Mark a dispatched trial as failed (the client exited without finishing it).

        Raises:
            ZeusBSONotFoundError: no such job or trial.
            ZeusBSOValueError: the batch size is not the trial's.

        """
        await self.db.run(_end_trial, trial)


# ---------------------------------------------------------------------------------------------
# Statements of the request path, compiled once per dialect (see `db.Statement`).

_B = sa.bindparam
_SEL_JOB_LOCKED = Statement(jobs.select().where(jobs.c.job_id == _B("k_job")).with_for_update())
_SEL_JOB = Statement(jobs.select().where(jobs.c.job_id == _B("k_job")))
_SEL_JOB_LOCKED_WITH_TRIAL = Statement(
    sa.select(
        jobs,
        trials.c.batch_size.label("trial_batch_size"),
        trials.c.status.label("trial_status"),
        trials.c.converged.label("trial_converged"),
        trials.c.current_epoch.label("trial_epoch"),
        trials.c.end_message.label("trial_end_message"),
    )
    .select_from(
        jobs.outerjoin(
            trials,
            (trials.c.job_id == jobs.c.job_id) & (trials.c.trial_number == _B("number")),
        )
    )
    .where(jobs.c.job_id == _B("k_job"))
    .with_for_update(of=jobs)
)
_UPD_JOB_PREDICT = Statement(
    jobs.update()
    .where(jobs.c.job_id == _B("k_job"))
    .values(next_trial_number=_B("b_next"), stage=_B("b_stage"), rng_state=_B("b_rng"))
)
_UPD_JOB_BEST = Statement(
    jobs.update()
    .where(jobs.c.job_id == _B("k_job"))
    .values(min_cost=_B("b_cost"), min_cost_batch_size=_B("b_bs"))
)
_INS_TRIAL = Statement(
    trials.insert().values(
        job_id=_B("b_job"),
        trial_number=_B("b_number"),
        batch_size=_B("b_bs"),
        type=_B("b_type"),
        status=STATUS_DISPATCHED,
        start_timestamp=_B("b_start"),
        report_count=0,
        request_id=_B("b_request", value=None, required=False),
    )
)
_SEL_TRIAL_OF_REQUEST = Statement(
    sa.select(trials.c.batch_size, trials.c.trial_number).where(
        (trials.c.job_id == _B("k_job")) & (trials.c.request_id == _B("k_request"))
    )
)
_TRIAL_KEY = (trials.c.job_id == _B("k_job")) & (trials.c.trial_number == _B("number"))
_SEL_TRIAL = Statement(
    sa.select(trials.c.batch_size, trials.c.status, trials.c.converged).where(_TRIAL_KEY)
)
_UPD_TRIAL_PROGRESS = Statement(
    trials.update()
    .where(_TRIAL_KEY)
    .values(
        report_count=trials.c.report_count + 1,
        current_epoch=_B("b_epoch"),
        metric=_B("b_metric"),
    )
)
# The progress update, plus the trial's end.
_UPD_TRIAL_FINISH = Statement(
    _UPD_TRIAL_PROGRESS.stmt.values(
        status=STATUS_SUCCEEDED,
        end_timestamp=_B("b_end"),
        time=_B("b_time"),
        energy=_B("b_energy"),
        converged=_B("b_converged"),
        end_message=_B("b_message"),
    )
)
_UPD_TRIAL_FAIL = Statement(
    trials.update().where(_TRIAL_KEY).values(status=STATUS_FAILED, end_timestamp=_B("b_end"))
)
_SEL_ARMS = Statement(
    sa.select(
        arms.c.batch_size,
        arms.c.param_mean,
        arms.c.param_precision,
        arms.c.reward_precision,
        arms.c.num_observations,
    )
    .where(arms.c.job_id == _B("k_job"))
    .order_by(arms.c.batch_size)
)
_UPD_ARM = Statement(
    arms.update()
    .where(arms.c.job_id == _B("k_job"), arms.c.batch_size == _B("bs"))
    .values(
        param_mean=_B("b_mean"),
        param_precision=_B("b_prec"),
        reward_precision=_B("b_rprec"),
        num_observations=_B("b_n"),
    )
)
# The job's record while pruning lasts: every trial that did not fail, oldest first.
_SEL_RECORD = Statement(
    sa.select(
        trials.c.batch_size,
        trials.c.type,
        trials.c.status,
        trials.c.converged,
        trials.c.time,
        trials.c.energy,
    )
    .where(trials.c.job_id == _B("k_job"), trials.c.status != STATUS_FAILED)
    .order_by(trials.c.trial_number)
)
_HISTORY_QUERY = (
    sa.select(trials.c.time, trials.c.energy)
    .where(
        trials.c.job_id == _B("k_job"),
        trials.c.batch_size == _B("bs"),
        trials.c.status == STATUS_SUCCEEDED,
    )
    .order_by(trials.c.trial_number.desc())
)
_HISTORY = Statement(_HISTORY_QUERY)
_HISTORY_WINDOW = Statement(_HISTORY_QUERY.limit(_B("window", type_=sa.Integer)))


def _insert_every_column(table: sa.Table) -> Statement:
    """INSERT of one row; every column is bound as `v_<column>`."""
    return Statement(table.insert().values({c.name: _B(f"v_{c.name}") for c in table.columns}))


_INS_JOB = _insert_every_column(jobs)
_INS_ARM = _insert_every_column(arms)
_DEL_TRIALS = Statement(trials.delete().where(trials.c.job_id == _B("k_job")))
_DEL_ARMS = Statement(arms.delete().where(arms.c.job_id == _B("k_job")))
_DEL_JOB = Statement(jobs.delete().where(jobs.c.job_id == _B("k_job")))

# Every statement above, compiled when a server starts (`BsoService.prepare`).
STATEMENTS = [v for v in list(globals().values()) if isinstance(v, Statement)]


# ---------------------------------------------------------------------------------------------
# Transactions (each runs inside `Database.run`).


async def _insert_job(tx: Tx, values: dict[str, Any]) -> None:
    await _INS_JOB.run(tx, {f"v_{k}": v for k, v in values.items()})


async def _read_job_config(tx: Tx, job_id: str) -> CreatedJob | None:
    row = await _SEL_JOB.first(tx, {"k_job": job_id})
    return None if row is None else _job_config(row)


async def _delete_job(tx: Tx, job_id: str) -> None:
    key = {"k_job": job_id}
    await _DEL_TRIALS.run(tx, key)
    await _DEL_ARMS.run(tx, key)
    if await _DEL_JOB.run(tx, key) == 0:
        raise ZeusBSONotFoundError(f"No job was deleted: unknown job_id {job_id!r}.", "job_id")


async def _lock_job(tx: Tx, job_id: str) -> Any:
    row = await _SEL_JOB_LOCKED.first(tx, {"k_job": job_id})
    if row is None:
        raise _unknown_job(job_id)
    return row


def _unknown_job(job_id: str) -> ZeusBSONotFoundError:
    return ZeusBSONotFoundError(
        f"Unknown job({job_id}) in field job_id. Please register the job first.", "job_id"
    )


async def _predict(tx: Tx, job_id: str, request_id: Optional[str]) -> TrialId:
    job = await _lock_job(tx, job_id)
    if request_id is not None:
        # The job's row lock orders a request and its retries: the first one inserts.
        done = await _SEL_TRIAL_OF_REQUEST.first(tx, {"k_job": job_id, "k_request": request_id})
        if done is not None:
            return TrialId(
                job_id=job_id, batch_size=done.batch_size, trial_number=done.trial_number
            )
    policy = logic.policy_of(job)
    rng = logic.load_rng(job.rng_state)
    if job.stage == STAGE_MAB:
        decision = policy.decide(await _load_arms(tx, job_id), {}, {}, 0, rng)
    else:
        explorations, rewards = await _load_record(tx, job)
        decision = policy.decide(None, explorations, rewards, job.min_cost_batch_size, rng)
    updates: dict[str, Any] = {"b_stage": job.stage, "b_rng": job.rng_state}
    if decision.new_arms is not None:
        await _insert_arms(tx, job_id, decision.new_arms)
        updates["b_stage"] = STAGE_MAB
    if decision.kind == "bandit":
        updates["b_rng"] = logic.dump_rng(rng)
    bs, kind = decision.batch_size, _TRIAL_TYPE[decision.kind]
    number = job.next_trial_number
    await _UPD_JOB_PREDICT.run(tx, {"k_job": job_id, "b_next": number + 1, **updates})
    await _INS_TRIAL.run(
        tx,
        {
            "b_job": job_id,
            "b_number": number,
            "b_bs": bs,
            "b_type": kind,
            "b_start": time.time(),
            "b_request": request_id,
        },
    )
    return TrialId(job_id=job_id, batch_size=bs, trial_number=number)


# The trial type of each kind of decision.
_TRIAL_TYPE = {
    "exploration": TRIAL_EXPLORATION,
    "concurrent": TRIAL_CONCURRENT,
    "bandit": TRIAL_MAB,
}


async def _load_arms(tx: Tx, job_id: str) -> list[logic.ArmState]:
    return [logic.ArmState(*r) for r in await _SEL_ARMS.rows(tx, {"k_job": job_id})]


async def _load_record(
    tx: Tx, job: Any
) -> tuple[dict[int, list[tuple[bool, bool, float]]], dict[int, list[float]]]:
    """The job's explorations and the rewards of its finished trials, per batch size."""
    explorations: dict[int, list[tuple[bool, bool, float]]] = {}
    rewards: dict[int, list[float]] = {}
    rows = await _SEL_RECORD.rows(tx, {"k_job": job.job_id})
    for bs, kind, status, converged, t, e in rows:
        if status == STATUS_DISPATCHED:
            if kind == TRIAL_EXPLORATION:
                explorations.setdefault(bs, []).append((True, False, 0.0))
            continue
        cost = zeus_cost(e, t, job.eta_knob, job.max_power)
        rewards.setdefault(bs, []).append(-cost)
        if kind == TRIAL_EXPLORATION:
            explorations.setdefault(bs, []).append((False, bool(converged), cost))
    return explorations, rewards


async def _insert_arms(tx: Tx, job_id: str, new_arms: list[logic.ArmState]) -> None:
    logic.logger.info("Construct MAB for %s with arms %s", job_id, [a.batch_size for a in new_arms])
    for a in new_arms:
        await _INS_ARM.run(
            tx,
            {
                "v_job_id": job_id,
                "v_batch_size": a.batch_size,
                "v_param_mean": a.param_mean,
                "v_param_precision": a.param_precision,
                "v_reward_precision": a.reward_precision,
                "v_num_observations": a.num_observations,
            },
        )


async def _report(tx: Tx, result: TrainingResult) -> ReportResponse:
    key = {"k_job": result.job_id, "number": result.trial_number}
    # The job's row (locked) and the trial's columns in one round trip.
    job = await _SEL_JOB_LOCKED_WITH_TRIAL.first(tx, key)
    if job is None:
        raise _unknown_job(result.job_id)
    if job.trial_status is None:
        raise ZeusBSONotFoundError(
            f"Unknown trial: trial_number {result.trial_number} of job {result.job_id}.",
            "trial_number",
        )
    batch_sizes = json.loads(job.batch_sizes)
    if result.batch_size not in batch_sizes:
        raise ZeusBSOValueError(
            f"batch_size {result.batch_size} is not one of the job's batch_sizes {batch_sizes}.",
            "batch_size",
        )
    if result.batch_size != job.trial_batch_size:
        raise ZeusBSOValueError(
            f"batch_size {result.batch_size} does not match trial "
            f"{result.trial_number}'s batch size {job.trial_batch_size}.",
            "batch_size",
        )
    if job.trial_status != STATUS_DISPATCHED:
        message = f"Result for this trial({result.trial_number}) is already reported."
        if result.current_epoch == job.trial_epoch and job.trial_end_message is not None:
            message = job.trial_end_message  # The last report again: its answer again.
        return ReportResponse(stop_train=True, converged=bool(job.trial_converged), message=message)
    # Reports are idempotent per (trial, epoch). A client that lost the answer to a report
    # sends it again. Had that report ended the trial, the answer above repeats how; the
    # trial is still running, so the first answer was "keep training" and this one is the
    # same, with nothing recorded twice.
    recorded = job.trial_epoch
    if recorded is not None and result.current_epoch <= recorded:
        if result.current_epoch < recorded:
            raise ZeusBSOValueError(
                f"current_epoch {result.current_epoch} is before epoch {recorded}, already "
                f"reported for trial {result.trial_number}; epochs must not go back.",
                "current_epoch",
            )
        return ReportResponse(
            stop_train=False,
            converged=False,
            message=f"Epoch {recorded} of this trial({result.trial_number}) is already "
            "reported; keep training",
        )
    cost = zeus_cost(result.energy, result.time, job.eta_knob, job.max_power)
    decision = logic.decide_report(
        batch_size=result.batch_size,
        cost=cost,
        metric=result.metric,
        current_epoch=result.current_epoch,
        target_metric=job.target_metric,
        higher_is_better=job.higher_is_better_metric,
        max_epochs=job.max_epochs,
        beta_knob=job.beta_knob,
        min_cost=job.min_cost,
    )
    progress = {**key, "b_epoch": result.current_epoch, "b_metric": result.metric}
    if not decision.stop:
        await _UPD_TRIAL_PROGRESS.run(tx, progress)
        return ReportResponse(stop_train=False, converged=False, message=decision.message)
    if job.stage == STAGE_MAB:
        await _refit_arm(tx, job, result)
    await _UPD_TRIAL_FINISH.run(
        tx,
        {
            **progress,
            "b_end": time.time(),
            "b_time": result.time,
            "b_energy": result.energy,
            "b_converged": decision.converged,
            "b_message": decision.message,
        },
    )
    # Only converged trials move the best cost (the reference's bug is fixed here).
    if decision.converged and (job.min_cost is None or cost < job.min_cost):
        best = {"k_job": job.job_id, "b_cost": cost, "b_bs": result.batch_size}
        await _UPD_JOB_BEST.run(tx, best)
    return ReportResponse(stop_train=True, converged=decision.converged, message=decision.message)


async def _refit_arm(tx: Tx, job: Any, result: TrainingResult) -> None:
    """Refit the arm of the reported batch size on its most recent `window_size` results.

    The policy fits an arm on the last `window_size` rewards of its batch size; only those
    are read: the `window_size - 1` latest finished trials of this batch size (any type,
    converged or not) plus this one (`window_size <= 0`: all of them). A trial of a batch size
    without an arm (pruned, but started before the bandit existed) changes no arm (the UPDATE
    matches no row).
    """
    params: dict[str, Any] = {"k_job": job.job_id, "bs": result.batch_size}
    if job.window_size > 0:
        history = await _HISTORY_WINDOW.rows(tx, {**params, "window": job.window_size - 1})
    else:
        history = await _HISTORY.rows(tx, params)
    history.reverse()
    rewards = [-zeus_cost(e, t, job.eta_knob, job.max_power) for t, e in history]
    rewards.append(-zeus_cost(result.energy, result.time, job.eta_knob, job.max_power))
    s = logic.policy_of(job).fit(result.batch_size, rewards)
    await _UPD_ARM.run(
        tx,
        {
            **params,
            "b_mean": s.param_mean,
            "b_prec": s.param_precision,
            "b_rprec": s.reward_precision,
            "b_n": s.num_observations,
        },
    )


async def _end_trial(tx: Tx, trial: TrialId) -> None:
    key = {"k_job": trial.job_id, "number": trial.trial_number}
    await _lock_job(tx, trial.job_id)
    found = await _SEL_TRIAL.first(tx, key)
    if found is None:
        raise ZeusBSONotFoundError(
            f"Could not find trial_number {trial.trial_number} of job {trial.job_id}.",
            "trial_number",
        )
    if found.batch_size != trial.batch_size:
        raise ZeusBSOValueError(
            f"batch_size {trial.batch_size} does not match trial "
            f"{trial.trial_number}'s batch size {found.batch_size}.",
            "batch_size",
        )
    if found.status == STATUS_DISPATCHED:
        await _UPD_TRIAL_FAIL.run(tx, {**key, "b_end": time.time()})
