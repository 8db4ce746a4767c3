"""external runs: a train run launched outside the job system (torchrun, srun) reports to a job

- ``jobs.external_key``: the key the run's reporter keeps in its run folder (a relaunch of the same
  folder finds its job, or starts the next attempt);
- ``jobs.report_seq``: the last report item applied, so that a batch sent twice applies once.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 10:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("external_key", sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch.add_column(sa.Column("report_seq", sa.BigInteger(), nullable=True))
        batch.create_index("ix_jobs_external_key", ["external_key"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_external_key")
        batch.drop_column("report_seq")
        batch.drop_column("external_key")
