"""checked reports: clear what unchecked reports left in integer columns of a SQLite database

Until reports from runs launched elsewhere were checked field by field (app/run/report_items.py), a
report could store text, or a number past 64 bits, where a count or a time belongs (`"total": "many"`,
`"tokens": "lots"`, `"at": "..."`): SQLite keeps whatever it is given, and the pages that read such a
row failed for good. Each such value becomes NULL (or 0 where a value is required). PostgreSQL never
stored one (its columns refuse them): nothing to do there. Downgrading keeps the cleared values.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, column, what replaces a value that is no integer)
INTEGER_COLUMNS = (
    ("jobs", "progress_done", "0"),
    ("jobs", "progress_total", "NULL"),
    ("job_events", "count", "1"),
    ("metric_points", "tokens", "NULL"),
    ("metric_points", "wall_ms", "0"),
    ("metric_series", "last_tokens", "NULL"),
    ("metric_series", "last_wall_ms", "NULL"),
    ("metric_rollups", "last_tokens", "NULL"),
    ("metric_rollups", "last_wall_ms", "0"),
    ("metric_steps", "tokens", "NULL"),
    ("metric_steps", "wall_ms", "0"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table, column, fill in INTEGER_COLUMNS:
        op.execute(f"UPDATE {table} SET {column} = {fill} WHERE typeof({column}) NOT IN ('integer', 'null')")


def downgrade() -> None:
    pass
