"""chunk heartbeats and losses, message send times, the workers table

- ``job_chunks.heartbeat_at``, ``losses``: a chunk whose worker died is found by its own stale beat
  (another worker may keep its job's beat fresh) and runs again once.
- ``jobs.sent_at``, ``job_chunks.sent_at``: when the message was last sent; SQL is the source of
  truth, and the sweeper re-sends a message the broker lost (Redis without persistence).
- ``workers``: each worker's beat and queues, so the sweeper and the job page know whether a live
  worker serves a queue.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 11:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STR = sqlmodel.sql.sqltypes.AutoString
TIME = sqlmodel.sql.sqltypes.UTCDateTime


def upgrade() -> None:
    with op.batch_alter_table("job_chunks") as batch:
        batch.add_column(sa.Column("heartbeat_at", TIME(), nullable=True))
        batch.add_column(sa.Column("sent_at", TIME(), nullable=True))
        batch.add_column(sa.Column("losses", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("sent_at", TIME(), nullable=True))
    op.create_table(
        "workers",
        sa.Column("name", STR(), nullable=False),
        sa.Column("queues", STR(), nullable=False),
        sa.Column("started_at", TIME(), nullable=False),
        sa.Column("heartbeat_at", TIME(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_workers")),
    )


def downgrade() -> None:
    op.drop_table("workers")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("sent_at")
    with op.batch_alter_table("job_chunks") as batch:
        batch.drop_column("losses")
        batch.drop_column("sent_at")
        batch.drop_column("heartbeat_at")
