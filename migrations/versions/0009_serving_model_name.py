"""serving endpoints: the model_name whose counts are the drafter's

- ``serving_endpoints.model_name``: one server may serve several models; their windows are stored
  apart already, and an endpoint that names one reads only that one's (NULL: all of them, summed).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 06:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("serving_endpoints") as batch:
        batch.add_column(sa.Column("model_name", sqlmodel.sql.sqltypes.AutoString(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("serving_endpoints") as batch:
        batch.drop_column("model_name")
