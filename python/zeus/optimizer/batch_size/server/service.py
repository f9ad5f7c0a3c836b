"""The server's operations, each one database transaction.

Every operation on an existing job starts by locking the job's row (see `db.py`), reads what
it needs, decides with the pure functions of `logic.py` and writes back before committing.
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
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from zeus.exception import ZeusBaseError
from zeus.optimizer.batch_size.common import (
    CreatedJob,
    JobSpecFromClient,
    ReportResponse,
    TrainingResult,
    TrialId,
)
from zeus.optimizer.batch_size.server import logic
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


class ZeusBSOServerBaseError(ZeusBaseError):
    """An error the server answers with `{"message": ...}` and `status_code`."""

    status_code = 500


class ZeusBSOValueError(ZeusBSOServerBaseError):
    """The request refers to something that does not exist or does not fit the job."""

    status_code = 400


class ZeusBSONotFoundError(ZeusBSOServerBaseError):
    """The thing to delete or end does not exist."""

    status_code = 404


class ZeusBSOJobConfigMismatchError(ZeusBSOServerBaseError):
    """A job id is registered again with a different configuration."""

    status_code = 409


class ZeusBSOServerRuntimeError(ZeusBSOServerBaseError):
    """The job cannot continue (no batch size survived a pruning round)."""

    status_code = 409


# Columns that make up a job's configuration (compared on re-registration).
_CONFIG_FIELDS = tuple(CreatedJob.model_fields)


def _job_config(row: Any) -> CreatedJob:
    data = {f: getattr(row, f) for f in _CONFIG_FIELDS}
    data["batch_sizes"] = json.loads(row.batch_sizes)
    return CreatedJob.model_validate(data)


class BsoService:
    """Job registration, batch size prediction and result reporting over one engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        """Use `engine` (its schema must be migrated)."""
        self.engine = engine

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
                async with self.engine.begin() as conn:
                    await conn.execute(jobs.insert().values(**values))
                return created, True
            except IntegrityError:
                if generate:
                    continue  # The random suffix collided; draw another.
            async with self.engine.begin() as conn:
                row = (await conn.execute(jobs.select().where(jobs.c.job_id == job_id))).first()
            if row is None:  # Deleted in between: try to create it again.
                continue
            existing = _job_config(row)
            if existing != created:
                diff = sorted(
                    f for f in _CONFIG_FIELDS if getattr(existing, f) != getattr(created, f)
                )
                raise ZeusBSOJobConfigMismatchError(
                    f"Job({job_id}) is already registered with a different configuration "
                    f"(fields {diff} differ). Use a new job_id for a different configuration."
                )
            return existing, False
        raise ZeusBSOServerBaseError(f"Could not register a job with prefix {spec.job_id_prefix}")

    async def delete(self, job_id: str) -> None:
        """Delete a job with its trials and arms.

        Raises:
            ZeusBSONotFoundError: no such job.

        """
        async with self.engine.begin() as conn:
            await conn.execute(trials.delete().where(trials.c.job_id == job_id))
            await conn.execute(arms.delete().where(arms.c.job_id == job_id))
            res = await conn.execute(jobs.delete().where(jobs.c.job_id == job_id))
            if res.rowcount == 0:
                raise ZeusBSONotFoundError(f"No job was deleted: unknown job_id {job_id!r}.")

    # -- prediction ---------------------------------------------------------------------------

    @staticmethod
    async def _lock_job(conn: AsyncConnection, job_id: str) -> Any:
        row = (
            await conn.execute(jobs.select().where(jobs.c.job_id == job_id).with_for_update())
        ).first()
        if row is None:
            raise ZeusBSOValueError(
                f"Unknown job({job_id}) in field job_id. Please register the job first."
            )
        return row

    async def predict(self, job_id: str) -> TrialId:
        """Start a new trial of `job_id` and return it (its batch size is the decision).

        Raises:
            ZeusBSOValueError: unknown job.
            ZeusBSOServerRuntimeError: pruning left no batch size.

        """
        async with self.engine.begin() as conn:
            job = await self._lock_job(conn, job_id)
            updates: dict[str, Any] = {}
            if job.stage == STAGE_MAB:
                arm_states = await self._load_arms(conn, job_id)
                bs = await self._mab_predict(conn, job, arm_states, updates)
                kind = TRIAL_MAB
            else:
                step = logic.next_exploration(
                    json.loads(job.batch_sizes),
                    job.default_batch_size,
                    job.num_pruning_rounds,
                    await self._load_explorations(conn, job),
                )
                if isinstance(step, logic.ExploreNext):
                    bs, kind = step.batch_size, TRIAL_EXPLORATION
                elif isinstance(step, logic.WaitForExploration):
                    bs, kind = job.min_cost_batch_size, TRIAL_CONCURRENT
                else:
                    arm_states = await self._construct_mab(conn, job, step.batch_sizes)
                    updates["stage"] = STAGE_MAB
                    bs = await self._mab_predict(conn, job, arm_states, updates)
                    kind = TRIAL_MAB
            number = job.next_trial_number
            updates["next_trial_number"] = number + 1
            await conn.execute(jobs.update().where(jobs.c.job_id == job_id).values(**updates))
            await conn.execute(
                trials.insert().values(
                    job_id=job_id,
                    trial_number=number,
                    batch_size=bs,
                    type=kind,
                    status=STATUS_DISPATCHED,
                    start_timestamp=time.time(),
                    report_count=0,
                )
            )
        return TrialId(job_id=job_id, batch_size=bs, trial_number=number)

    @staticmethod
    async def _load_arms(conn: AsyncConnection, job_id: str) -> list[logic.ArmState]:
        rows = await conn.execute(
            sa.select(
                arms.c.batch_size,
                arms.c.param_mean,
                arms.c.param_precision,
                arms.c.reward_precision,
                arms.c.num_observations,
            )
            .where(arms.c.job_id == job_id)
            .order_by(arms.c.batch_size)
        )
        return [logic.ArmState(*r) for r in rows]

    @staticmethod
    async def _load_explorations(
        conn: AsyncConnection, job: Any
    ) -> dict[int, list[logic.Exploration]]:
        rows = await conn.execute(
            sa.select(
                trials.c.batch_size,
                trials.c.status,
                trials.c.converged,
                trials.c.time,
                trials.c.energy,
            )
            .where(
                trials.c.job_id == job.job_id,
                trials.c.type == TRIAL_EXPLORATION,
                trials.c.status != STATUS_FAILED,
            )
            .order_by(trials.c.trial_number)
        )
        out: dict[int, list[logic.Exploration]] = {}
        for bs, status, converged, t, e in rows:
            if status == STATUS_DISPATCHED:
                exp = logic.Exploration(True, False, 0.0)
            else:
                exp = logic.Exploration(
                    False, bool(converged), zeus_cost(e, t, job.eta_knob, job.max_power)
                )
            out.setdefault(bs, []).append(exp)
        return out

    async def _construct_mab(
        self, conn: AsyncConnection, job: Any, good: list[int]
    ) -> list[logic.ArmState]:
        """Create one arm per surviving batch size, fitted on its explorations' rewards."""
        rows = await conn.execute(
            sa.select(trials.c.batch_size, trials.c.time, trials.c.energy)
            .where(
                trials.c.job_id == job.job_id,
                trials.c.type == TRIAL_EXPLORATION,
                trials.c.status == STATUS_SUCCEEDED,
                trials.c.batch_size.in_(good),
            )
            .order_by(trials.c.trial_number)
        )
        rewards: dict[int, list[float]] = {bs: [] for bs in good}
        for bs, t, e in rows:
            rewards[bs].append(-zeus_cost(e, t, job.eta_knob, job.max_power))
        states = [
            logic.fit_arm(bs, job.mab_prior_mean, job.mab_prior_precision, rewards[bs])
            for bs in sorted(good)
        ]
        logic.logger.info("Construct MAB for %s with arms %s", job.job_id, sorted(good))
        await conn.execute(
            arms.insert(),
            [
                {
                    "job_id": job.job_id,
                    "batch_size": s.batch_size,
                    "param_mean": s.param_mean,
                    "param_precision": s.param_precision,
                    "reward_precision": s.reward_precision,
                    "num_observations": s.num_observations,
                }
                for s in states
            ],
        )
        return states

    @staticmethod
    async def _mab_predict(
        conn: AsyncConnection, job: Any, arm_states: list[logic.ArmState], updates: dict
    ) -> int:
        rng = logic.load_rng(job.rng_state)
        bs = logic.thompson_predict(arm_states, job.mab_num_explorations, rng)
        updates["rng_state"] = logic.dump_rng(rng)
        return bs

    # -- reporting ----------------------------------------------------------------------------

    async def report(self, result: TrainingResult) -> ReportResponse:
        """Record a trial's progress and tell the client whether to stop.

        Raises:
            ZeusBSOValueError: unknown job or trial, or a batch size that does not match.

        """
        async with self.engine.begin() as conn:
            job = await self._lock_job(conn, result.job_id)
            trial = (
                await conn.execute(
                    trials.select().where(
                        trials.c.job_id == result.job_id,
                        trials.c.trial_number == result.trial_number,
                    )
                )
            ).first()
            if trial is None:
                raise ZeusBSOValueError(
                    f"Unknown trial: trial_number {result.trial_number} of job {result.job_id}."
                )
            if result.batch_size not in json.loads(job.batch_sizes):
                raise ZeusBSOValueError(
                    f"batch_size {result.batch_size} is not one of the job's batch_sizes "
                    f"{json.loads(job.batch_sizes)}."
                )
            if result.batch_size != trial.batch_size:
                raise ZeusBSOValueError(
                    f"batch_size {result.batch_size} does not match trial "
                    f"{result.trial_number}'s batch size {trial.batch_size}."
                )
            if trial.status != STATUS_DISPATCHED:
                return ReportResponse(
                    stop_train=True,
                    converged=bool(trial.converged),
                    message=f"Result for this trial({trial.trial_number}) is already reported.",
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
            trial_key = (trials.c.job_id == result.job_id) & (
                trials.c.trial_number == result.trial_number
            )
            progress = {
                "report_count": trials.c.report_count + 1,
                "current_epoch": result.current_epoch,
                "metric": result.metric,
            }
            if not decision.stop:
                await conn.execute(trials.update().where(trial_key).values(**progress))
                return ReportResponse(stop_train=False, converged=False, message=decision.message)
            if job.stage == STAGE_MAB:
                await self._refit_arm(conn, job, result, trial_key)
            await conn.execute(
                trials.update()
                .where(trial_key)
                .values(
                    status=STATUS_SUCCEEDED,
                    end_timestamp=time.time(),
                    time=result.time,
                    energy=result.energy,
                    converged=decision.converged,
                    **progress,
                )
            )
            # Only converged trials move the best cost (the reference's bug is fixed here).
            if decision.converged and (job.min_cost is None or cost < job.min_cost):
                await conn.execute(
                    jobs.update()
                    .where(jobs.c.job_id == job.job_id)
                    .values(min_cost=cost, min_cost_batch_size=result.batch_size)
                )
        return ReportResponse(
            stop_train=True, converged=decision.converged, message=decision.message
        )

    @staticmethod
    async def _refit_arm(
        conn: AsyncConnection, job: Any, result: TrainingResult, trial_key: Any
    ) -> None:
        """Refit the arm of the reported batch size on its most recent `window_size` results."""
        has_arm = (
            await conn.execute(
                sa.select(arms.c.batch_size).where(
                    arms.c.job_id == job.job_id, arms.c.batch_size == result.batch_size
                )
            )
        ).first()
        if has_arm is None:
            # A trial of a batch size that pruning dropped, started before the bandit existed.
            return
        query = (
            sa.select(trials.c.time, trials.c.energy)
            .where(
                trials.c.job_id == job.job_id,
                trials.c.batch_size == result.batch_size,
                trials.c.status == STATUS_SUCCEEDED,
            )
            .order_by(trials.c.trial_number.desc())
        )
        if job.window_size > 0:
            query = query.limit(job.window_size - 1)
        history = list(await conn.execute(query))
        history.reverse()
        rewards = [-zeus_cost(e, t, job.eta_knob, job.max_power) for t, e in history]
        rewards.append(-zeus_cost(result.energy, result.time, job.eta_knob, job.max_power))
        s = logic.fit_arm(result.batch_size, job.mab_prior_mean, job.mab_prior_precision, rewards)
        await conn.execute(
            arms.update()
            .where(arms.c.job_id == job.job_id, arms.c.batch_size == result.batch_size)
            .values(
                param_mean=s.param_mean,
                param_precision=s.param_precision,
                reward_precision=s.reward_precision,
                num_observations=s.num_observations,
            )
        )

    async def end_trial(self, trial: TrialId) -> None:
        """Mark a dispatched trial as failed (the client exited without finishing it).

        Raises:
            ZeusBSONotFoundError: no such trial.

        """
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    jobs.select().where(jobs.c.job_id == trial.job_id).with_for_update()
                )
            ).first()
            if row is not None:
                found = (
                    await conn.execute(
                        sa.select(trials.c.status, trials.c.batch_size).where(
                            trials.c.job_id == trial.job_id,
                            trials.c.trial_number == trial.trial_number,
                        )
                    )
                ).first()
            if row is None or found is None:
                raise ZeusBSONotFoundError(
                    f"Could not find trial_number {trial.trial_number} of job {trial.job_id}."
                )
            if found.batch_size != trial.batch_size:
                raise ZeusBSOValueError(
                    f"batch_size {trial.batch_size} does not match trial "
                    f"{trial.trial_number}'s batch size {found.batch_size}."
                )
            if found.status == STATUS_DISPATCHED:
                await conn.execute(
                    trials.update()
                    .where(
                        trials.c.job_id == trial.job_id,
                        trials.c.trial_number == trial.trial_number,
                    )
                    .values(status=STATUS_FAILED, end_timestamp=time.time())
                )
