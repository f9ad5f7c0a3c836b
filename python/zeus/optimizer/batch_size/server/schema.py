"""Database schema of the batch size optimizer server (SQLAlchemy Core tables).

Everything a job needs to continue after a restart lives here: its configuration, its stage,
the best cost so far, the next trial number, the bandit's random generator state (numpy PCG64
state as JSON), every trial and every bandit arm. The server keeps no job state in memory.

The migrations in `migrations/versions/` create exactly these tables; change both together.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

STAGE_PRUNING = "Pruning"
STAGE_MAB = "MAB"

TRIAL_EXPLORATION = "Exploration"
TRIAL_CONCURRENT = "Concurrent"
TRIAL_MAB = "MAB"

STATUS_DISPATCHED = "Dispatched"
STATUS_SUCCEEDED = "Succeeded"
STATUS_FAILED = "Failed"

jobs = sa.Table(
    "bso_job",
    metadata,
    sa.Column("job_id", sa.String(400), primary_key=True),
    sa.Column("job_id_prefix", sa.String(300), nullable=False),
    # JSON list of ints, sorted; never changes after registration.
    sa.Column("batch_sizes", sa.Text, nullable=False),
    sa.Column("default_batch_size", sa.Integer, nullable=False),
    sa.Column("eta_knob", sa.Double, nullable=False),
    sa.Column("beta_knob", sa.Double, nullable=True),
    sa.Column("target_metric", sa.Double, nullable=False),
    sa.Column("higher_is_better_metric", sa.Boolean, nullable=False),
    sa.Column("max_epochs", sa.Integer, nullable=False),
    sa.Column("num_pruning_rounds", sa.Integer, nullable=False),
    sa.Column("window_size", sa.Integer, nullable=False),
    sa.Column("mab_prior_mean", sa.Double, nullable=False),
    sa.Column("mab_prior_precision", sa.Double, nullable=False),
    sa.Column("mab_num_explorations", sa.Integer, nullable=False),
    sa.Column("mab_seed", sa.BigInteger, nullable=True),
    sa.Column("max_power", sa.Double, nullable=False),
    sa.Column("number_of_gpus", sa.Integer, nullable=False),
    sa.Column("gpu_model", sa.String(300), nullable=False),
    # Mutable state.
    sa.Column("stage", sa.String(16), nullable=False),
    sa.Column("min_cost", sa.Double, nullable=True),
    sa.Column("min_cost_batch_size", sa.Integer, nullable=False),
    sa.Column("next_trial_number", sa.Integer, nullable=False),
    sa.Column("rng_state", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

trials = sa.Table(
    "bso_trial",
    metadata,
    sa.Column(
        "job_id",
        sa.String(400),
        sa.ForeignKey("bso_job.job_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("trial_number", sa.Integer, primary_key=True),
    sa.Column("batch_size", sa.Integer, nullable=False),
    sa.Column("type", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("start_timestamp", sa.Double, nullable=False),
    sa.Column("end_timestamp", sa.Double, nullable=True),
    # Final (cumulative) time and energy, set when the trial ends.
    sa.Column("time", sa.Double, nullable=True),
    sa.Column("energy", sa.Double, nullable=True),
    sa.Column("converged", sa.Boolean, nullable=True),
    # Progress: how many reports were accepted for this trial and the latest of them.
    sa.Column("report_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("current_epoch", sa.Integer, nullable=True),
    sa.Column("metric", sa.Double, nullable=True),
    # The message of the answer that ended the trial, so that a retry of that last report
    # (its answer was lost) gets the same answer (revision 0002).
    sa.Column("end_message", sa.Text, nullable=True),
    # The client's name for the prediction that started the trial, so that a retry of that
    # request (its answer was lost) gets this trial instead of starting another (revision 0003).
    sa.Column("request_id", sa.String(64), nullable=True),
    sa.Index("bso_trial_request", "job_id", "request_id", unique=True),
)

arms = sa.Table(
    "bso_arm",
    metadata,
    sa.Column(
        "job_id",
        sa.String(400),
        sa.ForeignKey("bso_job.job_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("batch_size", sa.Integer, primary_key=True),
    sa.Column("param_mean", sa.Double, nullable=False),
    sa.Column("param_precision", sa.Double, nullable=False),
    sa.Column("reward_precision", sa.Double, nullable=False),
    sa.Column("num_observations", sa.Integer, nullable=False),
)
