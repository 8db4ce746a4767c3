"""chunk reuse on retry

- ``job_chunks.input_sha256``: what decides a chunk's shard (its input file, the tokenizer's files,
  the options); a retry reuses a done chunk of the failed attempt only when it matches.
- ``job_chunks.reused_from``: the failed attempt whose done chunk a chunk of the retry took over.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 12:45:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STR = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    with op.batch_alter_table("job_chunks") as batch:
        batch.add_column(sa.Column("input_sha256", STR(), nullable=True))
        batch.add_column(sa.Column("reused_from", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_chunks") as batch:
        batch.drop_column("reused_from")
        batch.drop_column("input_sha256")
