"""A trial keeps the client's name for the prediction request that started it.

`GET /jobs/batch_size` starts a trial. A client whose answer was lost could not ask again
without starting a second trial, which then stayed Dispatched and held up pruning. With a
`request_id` the client sends again, the server answers the retry with the trial that request
started. Trials of older clients, and of this revision's earlier trials, keep NULL (a unique
index allows any number of NULLs on SQLite and PostgreSQL).

Revision ID: 0003_trial_request_id
Revises: 0002_trial_end_message
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_trial_request_id"
down_revision = "0002_trial_end_message"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add `bso_trial.request_id` and its unique index per job."""
    op.add_column("bso_trial", sa.Column("request_id", sa.String(64), nullable=True))
    op.create_index("bso_trial_request", "bso_trial", ["job_id", "request_id"], unique=True)


def downgrade() -> None:
    """Drop the index and `bso_trial.request_id`."""
    op.drop_index("bso_trial_request", table_name="bso_trial")
    with op.batch_alter_table("bso_trial") as batch:
        batch.drop_column("request_id")
