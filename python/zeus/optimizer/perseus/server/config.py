"""The Perseus server's settings, read from `PERSEUS_*` environment variables.

Needs the `perseus` extra (`pydantic-settings`). zeus 0.8 kept them in
`zeus.optimizer.perseus.common`, where the name still works.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["PerseusSettings"]


class PerseusSettings(BaseSettings):
    """Server settings, read from `PERSEUS_*` environment variables.

    Attributes:
        scheduler: Scheduler class, given by its name in
            `zeus.optimizer.perseus.server.scheduler` (e.g. `"AllMaxFrequency"`); resolved to
            the class on validation.
        scheduler_args: Keyword arguments of the scheduler's constructor (JSON in the
            environment), checked against its signature.
        log_level: Server log level (upper-cased).
        dump_data: Whether to dump ranks, schedules and profiling results to `dump_dir`.
        dump_dir: Dump directory.
        max_job_idle_time: Seconds after which a job nobody talked to is dropped.
        cleanup_interval: Seconds between sweeps for idle jobs (not in the reference, which
            hard-codes 60 s).

    """

    model_config = SettingsConfigDict(env_prefix="PERSEUS_")

    # The reference's default, PointSolution, needs a solution file; this one needs no
    # argument, so the server starts with no settings at all.
    scheduler: Any = "AllMaxFrequency"
    scheduler_args: dict[str, Any] = {}
    log_level: str = "DEBUG"
    dump_data: bool = True
    dump_dir: str = "./dump"
    max_job_idle_time: float = Field(default=60 * 60 * 24 * 7, gt=0)
    cleanup_interval: float = Field(default=60.0, gt=0)

    @field_validator("scheduler", mode="before")
    @classmethod
    def _resolve_scheduler(cls, value: Any) -> type:
        from zeus.optimizer.perseus.server import scheduler as sched_mod

        if isinstance(value, str):
            found = getattr(sched_mod, value.rsplit(".", 1)[-1], None)
            if not (inspect.isclass(found) and issubclass(found, sched_mod.FrequencyScheduler)):
                raise ValueError(f"Unknown scheduler {value!r}")
            return found
        if inspect.isclass(value) and issubclass(value, sched_mod.FrequencyScheduler):
            return value
        raise ValueError(f"Unknown scheduler {value!r}")

    @field_validator("log_level")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()

    @model_validator(mode="after")
    def _check_scheduler_args(self) -> PerseusSettings:
        # The first three parameters (job_info, rank_infos, perseus_settings) are supplied by the
        # job manager; the rest must bind to `scheduler_args`.
        try:
            inspect.signature(self.scheduler).bind(None, None, None, **self.scheduler_args)
        except TypeError as e:
            raise ValueError(
                f"Invalid scheduler args {self.scheduler_args!r} for {self.scheduler.__name__}: {e}"
            ) from e
        return self
