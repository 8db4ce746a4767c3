"""metric store: points (NaN/inf as flags), per-series summaries, rollups by step, the step axis

Replaces the unused `metrics` table of 0001.

Revision ID: 0005
Revises: 0003
Create Date: 2026-12-01 10:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STR = sqlmodel.sql.sqltypes.AutoString


def _fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f(f"fk_{table}_job_id_jobs"))


def upgrade() -> None:
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_metrics_job_name_step")
    op.drop_table("metrics")

    op.create_table(
        "metric_points",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("name", STR(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("wall_ms", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("flag", sa.Integer(), nullable=False),
        _fk("metric_points"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_points")),
    )
    op.create_index("ix_metric_points_job_name_step", "metric_points", ["job_id", "name", "step"])

    op.create_table(
        "metric_series",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("name", STR(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("nonfinite", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=True),
        sa.Column("first_value", sa.Float(), nullable=True),
        sa.Column("last_step", sa.Integer(), nullable=True),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.Column("last_flag", sa.Integer(), nullable=False),
        sa.Column("last_tokens", sa.BigInteger(), nullable=True),
        sa.Column("last_wall_ms", sa.BigInteger(), nullable=True),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.Column("last_id", sa.BigInteger(), nullable=False),
        _fk("metric_series"),
        sa.PrimaryKeyConstraint("job_id", "name", name=op.f("pk_metric_series")),
    )

    op.create_table(
        "metric_rollups",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("name", STR(), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("idx", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("nonfinite", sa.Integer(), nullable=False),
        sa.Column("vmin", sa.Float(), nullable=True),
        sa.Column("vmax", sa.Float(), nullable=True),
        sa.Column("vsum", sa.Float(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.Column("last_tokens", sa.BigInteger(), nullable=True),
        sa.Column("last_wall_ms", sa.BigInteger(), nullable=False),
        _fk("metric_rollups"),
        sa.PrimaryKeyConstraint("job_id", "name", "level", "idx", name=op.f("pk_metric_rollups")),
    )

    op.create_table(
        "metric_steps",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("wall_ms", sa.BigInteger(), nullable=False),
        _fk("metric_steps"),
        sa.PrimaryKeyConstraint("job_id", "step", name=op.f("pk_metric_steps")),
    )
    op.create_index("ix_metric_steps_job_tokens", "metric_steps", ["job_id", "tokens"])
    op.create_index("ix_metric_steps_job_wall", "metric_steps", ["job_id", "wall_ms"])


def downgrade() -> None:
    op.drop_index("ix_metric_steps_job_wall", table_name="metric_steps")
    op.drop_index("ix_metric_steps_job_tokens", table_name="metric_steps")
    op.drop_table("metric_steps")
    op.drop_table("metric_rollups")
    op.drop_table("metric_series")
    op.drop_index("ix_metric_points_job_name_step", table_name="metric_points")
    op.drop_table("metric_points")
    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", STR(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        _fk("metrics"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metrics")),
    )
    op.create_index("ix_metrics_job_name_step", "metrics", ["job_id", "name", "step"])
