"""job_state_history; 64-bit counts; one retry per attempt

- ``job_state_history``: every accepted status change of a job or chunk (app/store/state.py).
- Progress, rows, bytes, event counts and metric steps become BIGINT: on PostgreSQL an input of
  2 GiB or more overflowed INTEGER (``progress_total 2202034233``). SQLite's INTEGER is 64-bit
  already; batch mode rewrites the tables there anyway, to keep the two schemas in step.
- ``jobs.retry_of`` becomes unique: one retry per failed attempt, even under concurrent requests.
  A database holding two retries of one attempt keeps the first as the retry; the later ones keep
  their rows and events but lose the link (``retry_of`` NULL).

Downgrade: drops the history and the unique constraint; the columns go back to INTEGER, which
fails on PostgreSQL if a value above 2^31-1 is stored.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 10:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG = {
    "jobs": [("progress_done", False), ("progress_total", True)],
    "job_events": [("count", False)],
    "job_outputs": [("rows", False), ("bytes", False)],
    "job_chunks": [("conversations", False), ("rows_in", True), ("rows_out", True), ("bytes", True)],
    "metrics": [("step", False)],
}


def _retype(to: sa.types.TypeEngine, from_: sa.types.TypeEngine) -> None:
    for table, columns in BIG.items():
        with op.batch_alter_table(table) as batch:
            for name, nullable in columns:
                batch.alter_column(name, type_=to, existing_type=from_, existing_nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "job_state_history",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("chunk_index", sa.Integer(), nullable=True),
        sa.Column("from_status", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("to_status", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("reason", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_state_history_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_state_history")),
    )
    op.create_index("ix_job_state_history_job_at", "job_state_history", ["job_id", "at"])
    _retype(sa.BigInteger(), sa.Integer())
    op.execute(
        "UPDATE jobs SET retry_of = NULL WHERE retry_of IS NOT NULL AND id <> "
        "(SELECT MIN(j2.id) FROM jobs j2 WHERE j2.retry_of = jobs.retry_of)"
    )
    with op.batch_alter_table("jobs") as batch:
        batch.create_unique_constraint(op.f("uq_jobs_retry_of"), ["retry_of"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(op.f("uq_jobs_retry_of"), type_="unique")
    _retype(sa.Integer(), sa.BigInteger())
    op.drop_index("ix_job_state_history_job_at", table_name="job_state_history")
    op.drop_table("job_state_history")
