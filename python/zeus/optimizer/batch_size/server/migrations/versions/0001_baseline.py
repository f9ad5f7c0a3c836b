"""Baseline: jobs, trials and bandit arms.

Revision ID: 0001_baseline
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the three tables."""
    op.create_table(
        "bso_job",
        sa.Column("job_id", sa.String(400), primary_key=True),
        sa.Column("job_id_prefix", sa.String(300), nullable=False),
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
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("min_cost", sa.Double, nullable=True),
        sa.Column("min_cost_batch_size", sa.Integer, nullable=False),
        sa.Column("next_trial_number", sa.Integer, nullable=False),
        sa.Column("rng_state", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
    )
    op.create_table(
        "bso_trial",
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
        sa.Column("time", sa.Double, nullable=True),
        sa.Column("energy", sa.Double, nullable=True),
        sa.Column("converged", sa.Boolean, nullable=True),
        sa.Column("report_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("current_epoch", sa.Integer, nullable=True),
        sa.Column("metric", sa.Double, nullable=True),
    )
    op.create_table(
        "bso_arm",
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


def downgrade() -> None:
    """Drop the three tables."""
    op.drop_table("bso_arm")
    op.drop_table("bso_trial")
    op.drop_table("bso_job")
