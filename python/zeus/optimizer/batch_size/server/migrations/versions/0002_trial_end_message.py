"""A trial keeps the message of the answer that ended it.

A client whose last report's answer was lost sends the report again; the server answers it
from the recorded trial, and with this column its message too ("Train succeeded", "...
exceeded the cost upper bound ...") rather than only "already reported". Trials that ended
before this revision keep NULL and get the old message.

Revision ID: 0002_trial_end_message
Revises: 0001_baseline
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_trial_end_message"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add `bso_trial.end_message`."""
    op.add_column("bso_trial", sa.Column("end_message", sa.Text, nullable=True))


def downgrade() -> None:
    """Drop `bso_trial.end_message`."""
    with op.batch_alter_table("bso_trial") as batch:
        batch.drop_column("end_message")
