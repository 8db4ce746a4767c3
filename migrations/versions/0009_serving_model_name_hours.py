"""serving endpoints: the model_name whose counts are the drafter's; hourly sums of the windows

- ``serving_endpoints.model_name``: one server may serve several models; their windows are stored
  apart already, and an endpoint that names one reads only that one's (NULL: all of them, summed).
- ``serving_hours``: per endpoint, model and hour, the windows' summed counts and the range of their
  figures, so a chart over months reads hours (filled here from the windows there are).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 06:10:00.000000
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STR = sqlmodel.sql.sqltypes.AutoString
HOUR_MS = 3_600_000


def upgrade() -> None:
    with op.batch_alter_table("serving_endpoints") as batch:
        batch.add_column(sa.Column("model_name", STR(), nullable=True))
    hours = op.create_table(
        "serving_hours",
        sa.Column("endpoint_id", sa.Integer(), nullable=False),
        sa.Column("model_name", STR(), nullable=False),
        sa.Column("hour", sa.BigInteger(), nullable=False),
        sa.Column("windows", sa.Integer(), nullable=False),
        sa.Column("drafts", sa.BigInteger(), nullable=False),
        sa.Column("draft_tokens", sa.BigInteger(), nullable=False),
        sa.Column("accepted", sa.BigInteger(), nullable=False),
        sa.Column("per_position", sa.JSON(), nullable=False),
        sa.Column("vmin", sa.Float(), nullable=True),
        sa.Column("vmax", sa.Float(), nullable=True),
        sa.Column("vlast", sa.Float(), nullable=True),
        sa.Column("last_wall_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["endpoint_id"], ["serving_endpoints.id"], name="fk_serving_hours_endpoint_id_serving_endpoints"
        ),
        sa.PrimaryKeyConstraint("endpoint_id", "model_name", "hour", name="pk_serving_hours"),
    )
    op.bulk_insert(hours, _hours_of_existing_windows())


def _hours_of_existing_windows() -> list[dict[str, Any]]:
    """The windows stored before this revision, summed by hour as app/serving/endpoints.py sums new ones."""
    kinds = dict(op.get_bind().execute(sa.text("SELECT id, kind FROM serving_endpoints")).all())
    rows = op.get_bind().execute(
        sa.text(
            "SELECT endpoint_id, model_name, wall_ms, drafts, draft_tokens, accepted, per_position, gauges"
            " FROM serving_windows ORDER BY wall_ms, id"
        )
    )
    out: dict[tuple[int, str, int], dict[str, Any]] = {}
    for ep, model, wall, drafts, draft_tokens, accepted, per, gauges in rows:
        per = json.loads(per) if isinstance(per, str) else (per or [])
        gauges = json.loads(gauges) if isinstance(gauges, str) else gauges
        if kinds.get(ep) == "sglang":
            v = (gauges or {}).get("accept_length")
        else:
            v = 1 + accepted / drafts if drafts else None
        h = out.setdefault(
            (ep, model, wall // HOUR_MS),
            {"endpoint_id": ep, "model_name": model, "hour": wall // HOUR_MS, "windows": 0, "drafts": 0,
             "draft_tokens": 0, "accepted": 0, "per_position": list(per), "vmin": None, "vmax": None,
             "vlast": None, "last_wall_ms": wall},
        )  # fmt: skip
        if h["windows"]:  # a position any window lacks is unknown, not zero
            have = h["per_position"]
            h["per_position"] = [
                have[i] + per[i] if i < len(have) and i < len(per) and None not in (have[i], per[i]) else None
                for i in range(max(len(have), len(per)))
            ]
        h["windows"] += 1
        h["drafts"] += drafts
        h["draft_tokens"] += draft_tokens
        h["accepted"] += accepted
        h["last_wall_ms"] = wall
        if v is not None:
            h["vmin"] = v if h["vmin"] is None else min(h["vmin"], v)
            h["vmax"] = v if h["vmax"] is None else max(h["vmax"], v)
            h["vlast"] = v
    return list(out.values())


def downgrade() -> None:
    op.drop_table("serving_hours")
    with op.batch_alter_table("serving_endpoints") as batch:
        batch.drop_column("model_name")
