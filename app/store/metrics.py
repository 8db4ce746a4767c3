"""The metric store: a run's points in SQL, written in batches, with a per-series summary and rollups
kept in the same transaction, so lists read summaries and charts read at most a few thousand rows.

- `metric_points`: one row per point. NaN and inf are kept as `flag` (1 nan, 2 +inf, 3 -inf) with
  `value` NULL: PostgreSQL stores NaN in a float column but SQLite turns it into NULL, and NaN would
  poison MIN/MAX on one and not the other.
- `metric_series`: per (job, name) the count, first, latest, min, max and last step.
- `metric_rollups`: per series and level L = 1..LEVELS, steps grouped by ``step >> 3L`` (8**L steps a
  row) with min, max, sum, count and the last point; the chart query (app/store/metric_query.py) picks the
  finest level that fits its row budget, so its cost does not grow with the series.
- `metric_steps`: per (job, step) the tokens seen and the wall time, to turn an x range in tokens
  or time into a step range.

Counts stay counts (draftdeck/jobs/context.py names them); ratios are made in the query.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case
from sqlalchemy import select as sa_select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from app.store.models import MetricRollup, MetricSeries, MetricStep, MetricValue
from draftdeck.jobs.context import MetricPoint

LEVELS = 6  # 8**6 = 262,144 steps a row at the top: a few rows even for a very long run
SHIFT = 3  # log2 of the rollup fan-out (8)

FINITE, NAN, POS_INF, NEG_INF = 0, 1, 2, 3
MAX_NAME = 200
LIVE_LIMIT = 5_000  # points per live read; the next read continues from the cursor


def flag_of(value: float) -> int:
    if math.isnan(value):
        return NAN
    if math.isinf(value):
        return POS_INF if value > 0 else NEG_INF
    return FINITE


def value_of(value: float | None, flag: int) -> float | None:
    """A stored (value, flag) back as a Python float (nan/inf restored); None for a NULL finite."""
    if flag == NAN:
        return math.nan
    if flag == POS_INF:
        return math.inf
    if flag == NEG_INF:
        return -math.inf
    return value


def record_metrics(
    session: Session, job_id: int, step: int, values: Mapping[str, float], tokens: int | None
) -> int:
    """Record `values` at `step` (`tokens` seen so far); what `RunContext.metrics` does over SQL."""
    return record_points(session, job_id, [MetricPoint(step, k, float(v), tokens) for k, v in values.items()])


def record_points(
    session: Session, job_id: int, points: Sequence[MetricPoint], wall_time: float | None = None
) -> int:
    """Write `points` of job `job_id` in one transaction (points, summaries, rollups, step axis) and
    commit. `wall_time` (epoch seconds) defaults to now. Returns the number of points written.

    Raises ValueError naming the point for a bad name or step, before anything is written."""
    if not points:
        return 0
    wall_ms = int((time.time() if wall_time is None else wall_time) * 1000)
    for i, p in enumerate(points):
        if not p.name or len(p.name) > MAX_NAME:
            raise ValueError(f"metric point {i}: name {p.name!r} must be 1..{MAX_NAME} characters")
        if not isinstance(p.step, int) or p.step < 0:
            raise ValueError(f"metric point {i} ({p.name}): step {p.step!r} must be an integer >= 0")
    tokens_at = _step_tokens(session, job_id, points)
    rows = []
    for p in points:
        v = float(p.value)
        flag = flag_of(v)
        tokens = p.tokens if p.tokens is not None else tokens_at.get(p.step)
        rows.append(
            {
                "job_id": job_id,
                "name": p.name,
                "step": p.step,
                "tokens": tokens,
                "wall_ms": wall_ms,
                "value": v if flag == FINITE else None,
                "flag": flag,
            }
        )
    table = MetricValue.__table__  # type: ignore[attr-defined]
    # RETURNING through executemany ("insertmanyvalues"): the ids give each series its newest id.
    ids = session.execute(table.insert().returning(table.c.id, sort_by_parameter_order=True), rows).scalars()
    for r, point_id in zip(rows, ids, strict=True):
        r["id"] = point_id
    _update_summaries(session, job_id, rows)
    _update_rollups(session, rows)
    _update_steps(session, job_id, rows)
    session.commit()
    return len(rows)


def _step_tokens(session: Session, job_id: int, points: Sequence[MetricPoint]) -> dict[int, int | None]:
    """Tokens seen at each step of the batch: given with the point, else what the step axis already
    holds for that step (a held-out pass at step s written after the training point of step s)."""
    known: dict[int, int | None] = {p.step: p.tokens for p in points if p.tokens is not None}
    missing = {p.step for p in points if p.tokens is None} - set(known)
    if missing:
        found = session.execute(
            select(MetricStep.step, MetricStep.tokens).where(
                MetricStep.job_id == job_id, col(MetricStep.step).in_(sorted(missing))
            )
        ).all()
        known.update({s: t for s, t in found})
    return known


def _update_summaries(session: Session, job_id: int, rows: list[dict[str, Any]]) -> None:
    names = sorted({r["name"] for r in rows})
    existing = {
        s.name: s
        for s in session.exec(
            select(MetricSeries)
            .where(MetricSeries.job_id == job_id, col(MetricSeries.name).in_(names))
            .with_for_update()
        ).all()
    }
    for r in rows:
        s = existing.get(r["name"])
        if s is None:
            s = existing[r["name"]] = MetricSeries(job_id=job_id, name=r["name"])
            session.add(s)
        v, flag = r["value"], r["flag"]
        s.count += 1
        s.last_id = max(s.last_id, r["id"])
        if s.first_step is None or r["step"] < s.first_step:
            s.first_step, s.first_value = r["step"], v
        if s.last_step is None or r["step"] >= s.last_step:
            s.last_step, s.last_value, s.last_flag = r["step"], v, flag
            s.last_tokens, s.last_wall_ms = r["tokens"], r["wall_ms"]
        if flag != FINITE:
            s.nonfinite += 1
        else:
            s.min_value = v if s.min_value is None else min(s.min_value, v)
            s.max_value = v if s.max_value is None else max(s.max_value, v)
    session.flush()


@dataclass
class _Agg:
    n: int = 0
    nonfinite: int = 0
    vmin: float | None = None
    vmax: float | None = None
    vsum: float = 0.0
    last_step: int = -1
    last_value: float | None = None
    last_tokens: int | None = None
    last_wall_ms: int = 0

    def add(self, r: dict[str, Any]) -> None:
        v = r["value"]
        if r["flag"] == FINITE:
            self.n += 1
            self.vsum += v
            self.vmin = v if self.vmin is None else min(self.vmin, v)
            self.vmax = v if self.vmax is None else max(self.vmax, v)
        else:
            self.nonfinite += 1
        if r["step"] >= self.last_step:
            self.last_step, self.last_value = r["step"], v
            self.last_tokens, self.last_wall_ms = r["tokens"], r["wall_ms"]


def _insert(session: Session, table: Any) -> Any:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"the metric store supports SQLite and PostgreSQL, not {dialect}")


def _merge_min(old: Any, new: Any, smaller: bool) -> Any:
    better = new < old if smaller else new > old
    return case((old.is_(None), new), (new.is_(None), old), (better, new), else_=old)


def _update_rollups(session: Session, rows: list[dict[str, Any]]) -> None:
    aggs: dict[tuple[int, str, int, int], _Agg] = {}
    for r in rows:
        for level in range(1, LEVELS + 1):
            key = (r["job_id"], r["name"], level, r["step"] >> (SHIFT * level))
            agg = aggs.get(key)
            if agg is None:
                agg = aggs[key] = _Agg()
            agg.add(r)
    table = MetricRollup.__table__  # type: ignore[attr-defined]
    stmt = _insert(session, table)
    t, ex = table.c, stmt.excluded
    newer = ex.last_step >= t.last_step
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "name", "level", "idx"],
        set_={
            "n": t.n + ex.n,
            "nonfinite": t.nonfinite + ex.nonfinite,
            "vmin": _merge_min(t.vmin, ex.vmin, True),
            "vmax": _merge_min(t.vmax, ex.vmax, False),
            "vsum": t.vsum + ex.vsum,
            **{
                c: case((newer, getattr(ex, c)), else_=getattr(t, c))
                for c in ("last_value", "last_tokens", "last_wall_ms")
            },
            # last: the step decides the others above, so it is set from the same comparison
            "last_step": case((newer, ex.last_step), else_=t.last_step),
        },
    )
    params = [
        {"job_id": j, "name": n, "level": lv, "idx": idx, **a.__dict__}
        for (j, n, lv, idx), a in sorted(aggs.items())
    ]
    session.execute(stmt, params)


def _update_steps(session: Session, job_id: int, rows: list[dict[str, Any]]) -> None:
    seen: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r["step"] not in seen or (seen[r["step"]]["tokens"] is None and r["tokens"] is not None):
            seen[r["step"]] = {
                "job_id": job_id,
                "step": r["step"],
                "tokens": r["tokens"],
                "wall_ms": r["wall_ms"],
            }
    table = MetricStep.__table__  # type: ignore[attr-defined]
    stmt = _insert(session, table)
    # The first write of a step keeps its wall time; tokens fill in if it had none.
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "step"],
        set_={"tokens": case((table.c.tokens.is_(None), stmt.excluded.tokens), else_=table.c.tokens)},
    )
    session.execute(stmt, [seen[s] for s in sorted(seen)])


def summaries(session: Session, job_ids: Iterable[int]) -> dict[int, dict[str, MetricSeries]]:
    """The series summaries of each job: {job: {name: summary}} (no point is read)."""
    out: dict[int, dict[str, MetricSeries]] = {}
    ids = sorted(set(job_ids))
    if not ids:
        return out
    for s in session.exec(select(MetricSeries).where(col(MetricSeries.job_id).in_(ids))).all():
        out.setdefault(s.job_id, {})[s.name] = s
    return out


def points_since(
    session: Session, job_id: int, names: Sequence[str], after_id: int, limit: int = LIVE_LIMIT
) -> tuple[list[tuple[int, str, int, int | None, int, float | None, int]], int]:
    """Points of `job_id` named in `names` with an id above `after_id`, in the order written:
    ((id, name, step, tokens, wall_ms, value, flag) rows, the cursor after them). A run has one
    writer, so its ids grow in commit order. A read cut by `limit` ends before the last step it
    reached, so a step's counts (tau's accepted and steps) always arrive together."""
    p = MetricValue
    rows = list(
        session.execute(
            sa_select(
                col(p.id), col(p.name), col(p.step), col(p.tokens), col(p.wall_ms), col(p.value), col(p.flag)
            )
            .where(col(p.id) > after_id, col(p.job_id) == job_id, col(p.name).in_(list(names)))
            .order_by(col(p.id))
            .limit(limit)
        ).tuples()
    )
    if len(rows) == limit:
        last_step = rows[-1][2]
        cut = [r for r in rows if r[2] != last_step]
        rows = cut or rows  # one step with more points than the limit: send it whole anyway
    return rows, (rows[-1][0] if rows else after_id)


def last_ids(session: Session, job_ids: Iterable[int]) -> dict[int, int]:
    """Per job, the id of its newest point (0 when it has none): a live stream's starting cursor."""
    out = dict.fromkeys(job_ids, 0)
    for job, sums in summaries(session, out).items():
        out[job] = max((s.last_id for s in sums.values()), default=0)
    return out
