"""job_chunks: a job split into chunk tasks (tokenize), one row per chunk

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 10:05:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("chunk_index", sa.Integer(), nullable=False),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("input_path", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("conversations", sa.Integer(), nullable=False),
        sa.Column("rows_in", sa.Integer(), nullable=True),
        sa.Column("rows_out", sa.Integer(), nullable=True),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("shard_path", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("bytes", sa.Integer(), nullable=True),
        sa.Column("sha256", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("worker", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("task_id", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("error", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("finalized_by", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("started_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("finished_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_chunks_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_chunks")),
        sa.UniqueConstraint("job_id", "chunk_index", name=op.f("uq_job_chunks_job_id_chunk_index")),
    )
    with op.batch_alter_table("job_chunks", schema=None) as batch_op:
        batch_op.create_index("ix_job_chunks_job_status", ["job_id", "status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_chunks", schema=None) as batch_op:
        batch_op.drop_index("ix_job_chunks_job_status")

    op.drop_table("job_chunks")
