"""serving endpoints

- ``serving_endpoints``: the served drafters DraftDeck scrapes, with their health.
- ``serving_windows``: per scrape and model_name, the counter deltas over the scrape before (or
  SGLang's gauges) and the raw values scraped.
- ``alerts.endpoint_id``: an alert about an endpoint (unreachable, served tau below eval tau).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 21:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STR = sqlmodel.sql.sqltypes.AutoString
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "serving_endpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", STR(), nullable=False),
        sa.Column("kind", STR(), nullable=False),
        sa.Column("base_url", STR(), nullable=False),
        sa.Column("metrics_url", STR(), nullable=False),
        sa.Column("drafter", STR(), nullable=True),
        sa.Column("run_job_id", sa.Integer(), nullable=True),
        sa.Column("token_env", STR(), nullable=True),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("next_scrape_at", sa.DateTime(), nullable=False),
        sa.Column("last_scrape_at", sa.DateTime(), nullable=True),
        sa.Column("last_ok_at", sa.DateTime(), nullable=True),
        sa.Column("last_error", STR(), nullable=True),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_raw", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["run_job_id"], ["jobs.id"], name="fk_serving_endpoints_run_job_id_jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_serving_endpoints"),
        sa.UniqueConstraint("name", name="uq_serving_endpoints_name"),
    )
    op.create_index("ix_serving_endpoints_run_job_id", "serving_endpoints", ["run_job_id"])
    op.create_index("ix_serving_endpoints_next_scrape_at", "serving_endpoints", ["next_scrape_at"])
    op.create_table(
        "serving_windows",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("endpoint_id", sa.Integer(), nullable=False),
        sa.Column("wall_ms", sa.BigInteger(), nullable=False),
        sa.Column("model_name", STR(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("engines", sa.Integer(), nullable=False),
        sa.Column("restarted", sa.Integer(), nullable=False),
        sa.Column("drafts", sa.BigInteger(), nullable=False),
        sa.Column("draft_tokens", sa.BigInteger(), nullable=False),
        sa.Column("accepted", sa.BigInteger(), nullable=False),
        sa.Column("per_position", sa.JSON(), nullable=False),
        sa.Column("gauges", sa.JSON(), nullable=True),
        sa.Column("raw", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["endpoint_id"], ["serving_endpoints.id"], name="fk_serving_windows_endpoint_id_serving_endpoints"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_serving_windows"),
    )
    op.create_index("ix_serving_windows_endpoint_wall", "serving_windows", ["endpoint_id", "wall_ms"])
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("endpoint_id", sa.Integer(), nullable=True))
        batch.create_index("ix_alerts_endpoint_id", ["endpoint_id"])
        batch.create_foreign_key(
            "fk_alerts_endpoint_id_serving_endpoints", "serving_endpoints", ["endpoint_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_constraint("fk_alerts_endpoint_id_serving_endpoints", type_="foreignkey")
        batch.drop_index("ix_alerts_endpoint_id")
        batch.drop_column("endpoint_id")
    op.drop_index("ix_serving_windows_endpoint_wall", table_name="serving_windows")
    op.drop_table("serving_windows")
    op.drop_index("ix_serving_endpoints_next_scrape_at", table_name="serving_endpoints")
    op.drop_index("ix_serving_endpoints_run_job_id", table_name="serving_endpoints")
    op.drop_table("serving_endpoints")
