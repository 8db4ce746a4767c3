"""The chart query: runs x names x x-range x point budget -> per bucket min, max and last.

Bucketing happens in SQL (GROUP BY bucket index, integer arithmetic, the same on SQLite and
PostgreSQL) over the finest store level whose rows in range fit `ROWS_PER_BUCKET * budget`: the raw
points of a short series or a zoomed-in range, a rollup level (app/store/metrics.py) otherwise. The band
(min, max) comes from every point, so a spike inside a bucket survives; the line is the bucket's last
point; each series' first and last point in range are kept exactly. A zoom asks again with the new
range and gets finer levels.

Derived series are ratios made here from count series, per bucket from summed counts (never an
average of ratios): see `DERIVED` and `derived_parts`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlmodel import Session

from app.store.metrics import LEVELS, SHIFT, value_of

AXES = {"step": "step", "tokens": "tokens", "time": "wall_ms"}
MAX_BUDGET = 5000
MAX_SERIES = 200
ROWS_PER_BUCKET = 4
NO_BOUND = 2**62
# x coordinates are steps, tokens and epoch milliseconds: all below 2^53 (what a chart's doubles hold
# exactly), so the bucket arithmetic in SQL stays within 64 bits
MAX_COORDINATE = 2**53

# name -> (numerator series, denominator series, offset): value = offset + sum(num) / sum(den).
DERIVED: dict[str, tuple[str, str, float]] = {
    "heldout/tau_walked": ("heldout/walked/accepted", "heldout/walked/steps", 1.0),  # judged by the data
    "heldout/tau_target": ("heldout/target_walked/accepted", "heldout/target_walked/steps", 1.0),
    "heldout/tau_anchor": ("heldout/anchor/accepted", "heldout/anchor/blocks", 1.0),
    "heldout/agreement": ("heldout/agreement/matches", "heldout/agreement/tokens", 0.0),
    "heldout/agreement_expected": ("heldout/agreement/expected_sum", "heldout/agreement/tokens", 0.0),
    "heldout/target_prob": ("heldout/agreement/prob_sum", "heldout/agreement/tokens", 0.0),
    "eval/tau": ("eval/accepted", "eval/steps", 1.0),
    "eval/tokens_per_step": ("eval/produced", "eval/steps", 0.0),  # z-lab's convention
}
# per-position acceptance: greedy (the argmax is the label), expected when sampling at T = 1 (a
# sampling drafter: sum min(p, q)), or the target's probability of the drafter's argmax (a greedy one)
_POS = re.compile(r"^(train|heldout)/pos/(\d+)/(acc|expected|draft_prob)$")
_POS_PARTS = {"acc": ("correct", "total"), "expected": ("accept_sum", "accept_total"),
              "draft_prob": ("draft_prob_sum", "accept_total")}  # fmt: skip
# one source's held-out taus from the trainer's heldout/source/<name>/... counts
_SOURCE_TAU = re.compile(r"^heldout/source/(.+)/tau_(walked|target)$")


class QueryError(ValueError):
    """A chart request that cannot be answered as asked (HTTP 400, the message says why)."""


def derived_parts(name: str) -> tuple[str, str, float] | None:
    """(numerator, denominator, offset) of a derived series name, or None for a stored series."""
    if name in DERIVED:
        return DERIVED[name]
    m = _POS.match(name)
    if m:
        num, den = _POS_PARTS[m[3]]
        return f"{m[1]}/pos/{m[2]}/{num}", f"{m[1]}/pos/{m[2]}/{den}", 0.0
    m = _SOURCE_TAU.match(name)
    if m:
        walk = "walked" if m[2] == "walked" else "target_walked"
        return f"heldout/source/{m[1]}/{walk}/accepted", f"heldout/source/{m[1]}/{walk}/steps", 1.0
    return None


@dataclass
class Series:
    job_id: int
    name: str
    level: int = 0  # the store level read: 0 raw points, L >= 1 rollups of 8**L steps
    x: list[float] = field(default_factory=list)
    y: list[float | None] = field(default_factory=list)  # the bucket's last value (None: NaN/inf)
    lo: list[float | None] = field(default_factory=list)
    hi: list[float | None] = field(default_factory=list)
    nonfinite: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job_id,
            "name": self.name,
            "level": self.level,
            "x": self.x,
            "y": self.y,
            "min": self.lo,
            "max": self.hi,
            "nonfinite": self.nonfinite,
        }


@dataclass
class Result:
    axis: str
    lo: int | None
    hi: int | None
    budget: int
    series: list[Series]

    def as_json(self) -> dict[str, Any]:
        return {
            "x": self.axis,
            "lo": self.lo,
            "hi": self.hi,
            "budget": self.budget,
            "series": [s.as_json() for s in self.series],
        }


def query(
    session: Session,
    job_ids: Sequence[int],
    names: Sequence[str],
    *,
    axis: str = "step",
    lo: int | None = None,
    hi: int | None = None,
    budget: int = 500,
) -> Result:
    """Every (job, name) series bucketed on one grid over [lo, hi] of `axis` (step | tokens | time,
    time in epoch ms); `budget` buckets. Bounds left out span all the jobs' points."""
    if axis not in AXES:
        raise QueryError(f"x axis {axis!r}: use one of {', '.join(AXES)}")
    if not 1 <= budget <= MAX_BUDGET:
        raise QueryError(f"point budget {budget}: must be 1..{MAX_BUDGET}")
    for bound in (lo, hi):
        if bound is not None and not 0 <= bound <= MAX_COORDINATE:
            raise QueryError(f"x bound {bound}: must be 0..{MAX_COORDINATE}")
    if lo is not None and hi is not None and lo > hi:
        raise QueryError(f"x range {lo}..{hi}: the start is after the end")
    if not job_ids or not names:
        raise QueryError("name at least one run and one metric")
    if len(job_ids) * len(names) > MAX_SERIES:
        raise QueryError(f"{len(job_ids)} runs x {len(names)} metrics: at most {MAX_SERIES} series a query")
    col = AXES[axis]
    g_lo, g_hi = _grid(session, job_ids, col, lo, hi)
    out = Result(axis, lo, hi, budget, [])
    for job in job_ids:
        grid = (g_lo, g_hi) if g_lo is not None and g_hi is not None else None
        steps = _step_range(session, job, col, *grid) if grid else None
        for name in names:
            series = Series(job, name)
            if steps is not None and grid is not None:
                _fill(session, series, col, steps, *grid, budget)
            out.series.append(series)
    return out


def _grid(
    session: Session, job_ids: Sequence[int], col: str, lo: int | None, hi: int | None
) -> tuple[int | None, int | None]:
    """The x bounds of the bucket grid: the asked ones, else what the jobs' step axis spans."""
    if lo is not None and hi is not None:
        return lo, hi
    # One job at a time: SQLite answers MIN/MAX from the index for `job_id = ?`, not for `IN (...)`.
    found: list[tuple[int, int]] = []
    for job in job_ids:
        ends = [
            session.execute(
                text(
                    f"SELECT {col} FROM metric_steps WHERE job_id = :j AND {col} IS NOT NULL"
                    f" ORDER BY {col} {order} LIMIT 1"
                ),
                {"j": job},
            ).scalar()
            for order in ("ASC", "DESC")
        ]
        if ends[0] is not None and ends[1] is not None:
            found.append((int(ends[0]), int(ends[1])))
    if not found:
        return None, None
    return (min(f[0] for f in found) if lo is None else lo), (max(f[1] for f in found) if hi is None else hi)


def _step_range(session: Session, job: int, col: str, lo: int, hi: int) -> tuple[int, int] | None:
    """[lo, hi] of `col` as a step range of `job` (tokens and time grow with the step)."""
    if col == "step":
        return lo, hi
    first = session.execute(
        text(f"SELECT step FROM metric_steps WHERE job_id = :j AND {col} >= :lo ORDER BY {col} LIMIT 1"),
        {"j": job, "lo": lo},
    ).scalar()
    last = session.execute(
        text(f"SELECT step FROM metric_steps WHERE job_id = :j AND {col} <= :hi ORDER BY {col} DESC LIMIT 1"),
        {"j": job, "hi": hi},
    ).scalar()
    if first is None or last is None or first > last:
        return None
    return int(first), int(last)


def _count_at(session: Session, job: int, name: str, level: int, s0: int, s1: int, limit: int) -> int:
    """Rows of one series at `level` in steps [s0, s1], counting no further than `limit`."""
    if level == 0:
        sql = "SELECT 1 FROM metric_points WHERE job_id = :j AND name = :n AND step BETWEEN :a AND :b"
        args = {"a": s0, "b": s1}
    else:
        sql = (
            "SELECT 1 FROM metric_rollups WHERE job_id = :j AND name = :n AND level = :l"
            " AND idx BETWEEN :a AND :b"
        )
        args = {"l": level, "a": s0 >> (SHIFT * level), "b": s1 >> (SHIFT * level)}
    return int(
        session.execute(
            text(f"SELECT COUNT(*) FROM ({sql} LIMIT :lim) AS t"), {"j": job, "n": name, "lim": limit, **args}
        ).scalar_one()
    )


def _level(session: Session, job: int, name: str, s0: int, s1: int, budget: int) -> int:
    """The finest level with at most ROWS_PER_BUCKET * budget rows in range (coarse to fine: each
    probe stops at the limit, and each finer level has ~8x the rows, so probing costs ~1 limit)."""
    limit = ROWS_PER_BUCKET * budget
    chosen = LEVELS
    for level in range(LEVELS, -1, -1):
        if _count_at(session, job, name, level, s0, s1, limit + 1) > limit:
            break
        chosen = level
    return chosen


def _rows_sql(level: int, col: str) -> str:
    """(k, x, vmin, vmax, last, vsum, n, nonfinite) rows of one series at `level`; k (step or step
    group) orders ties in x."""
    if level == 0:
        return (
            f"SELECT step AS k, CAST({col} AS BIGINT) AS x, value AS vmin, value AS vmax, value AS last,"
            " COALESCE(value, 0) AS vsum, CASE WHEN flag = 0 THEN 1 ELSE 0 END AS n,"
            " CASE WHEN flag = 0 THEN 0 ELSE 1 END AS nonfinite"
            " FROM metric_points WHERE job_id = :j AND name = {name} AND step BETWEEN :a AND :b"
            f" AND {col} IS NOT NULL"
        )
    lcol = {"step": "last_step", "tokens": "last_tokens", "wall_ms": "last_wall_ms"}[col]
    return (
        f"SELECT idx AS k, CAST({lcol} AS BIGINT) AS x, vmin, vmax, last_value AS last, vsum, n, nonfinite"
        " FROM metric_rollups WHERE job_id = :j AND name = {name} AND level = :l AND idx BETWEEN :a AND :b"
        f" AND {lcol} IS NOT NULL"
    )


def _pairs_sql(level: int, col: str) -> str:
    """(x, numerator, denominator) of a derived series at `level`, one row per step (raw) or step
    group (rollup) where both counts have one. One pass over both series' index ranges grouped by
    the key, not a join: a join's plan depends on table statistics a fresh run does not have yet."""
    if level == 0:
        table, key, x, v = "metric_points", "step", col, "value"
        extra = " AND step BETWEEN :a AND :b AND flag = 0"
    else:
        table, key, v = "metric_rollups", "idx", "vsum"
        x = {"step": "last_step", "tokens": "last_tokens", "wall_ms": "last_wall_ms"}[col]
        extra = " AND level = :l AND idx BETWEEN :a AND :b"
    return (
        f"SELECT CAST(MAX(CASE WHEN name = :n2 THEN {x} END) AS BIGINT) AS x,"
        f" SUM(CASE WHEN name = :n1 THEN {v} END) AS a, SUM(CASE WHEN name = :n2 THEN {v} END) AS d"
        f" FROM {table} WHERE job_id = :j AND name IN (:n1, :n2){extra}"
        f" GROUP BY {key}"
        f" HAVING COUNT(CASE WHEN name = :n1 THEN 1 END) > 0 AND COUNT(CASE WHEN name = :n2 THEN 1 END) > 0"
        f" AND MAX(CASE WHEN name = :n2 THEN {x} END) IS NOT NULL"
    )


# The bucket index of a row's x (app/serving/series.py buckets served tau with it too). Integer
# division truncates the same way on both databases; edge rows of a rollup may reach past
# the range, so the index is clamped into [0, nb).
BUCKET = (
    "CASE WHEN (x - :lo) * :nb / :span >= :nb THEN :nb - 1 WHEN x < :lo THEN 0"
    " ELSE (x - :lo) * :nb / :span END"
)


def _fill(
    session: Session, s: Series, col: str, steps: tuple[int, int], lo: int, hi: int, budget: int
) -> None:
    parts = derived_parts(s.name)
    den = parts[1] if parts else s.name
    s0, s1 = steps
    s.level = _level(session, s.job_id, den, s0, s1, budget)
    shift = SHIFT * s.level
    args: dict[str, Any] = {
        "j": s.job_id,
        "l": s.level,
        "a": s0 >> shift if s.level else s0,
        "b": s1 >> shift if s.level else s1,
        "lo": lo,
        "nb": budget,
        "span": max(hi - lo, 1),
        "n1": parts[0] if parts else s.name,
        "n2": den,
    }
    rows_sql = _rows_sql(s.level, col)
    if parts is None:
        sql = f"""
        WITH r AS ({rows_sql.format(name=":n1")}),
        b AS (SELECT {BUCKET} AS bk, r.* FROM r),
        ranked AS (SELECT b.*, ROW_NUMBER() OVER (PARTITION BY bk ORDER BY x DESC, k DESC) AS rn FROM b)
        SELECT bk, MAX(x), MIN(vmin), MAX(vmax), MAX(CASE WHEN rn = 1 THEN last END),
               SUM(nonfinite), MAX(CASE WHEN rn = 1 THEN n END)
        FROM ranked GROUP BY bk ORDER BY bk"""
        for _bk, x, vmin, vmax, last, nonfinite, last_ok in session.execute(text(sql), args):
            s.x.append(x)
            s.y.append(last if last_ok else None)
            s.lo.append(vmin)
            s.hi.append(vmax)
            s.nonfinite.append(int(nonfinite))
    else:
        offset = parts[2]
        # The bucket's value is offset + the ratio of its summed counts; the band spans the ratios
        # of the rows inside it.
        sql = f"""
        WITH r AS (SELECT x, a, d, CASE WHEN d > 0 THEN a / d END AS ratio
                   FROM ({_pairs_sql(s.level, col)}) AS p),
        b AS (SELECT {BUCKET} AS bk, r.* FROM r)
        SELECT bk, MAX(x), SUM(a), SUM(d), MIN(ratio), MAX(ratio) FROM b GROUP BY bk ORDER BY bk"""
        for _bk, x, a, d, rmin, rmax in session.execute(text(sql), args):
            s.x.append(x)
            s.y.append(offset + a / d if d else None)
            s.lo.append(None if rmin is None else offset + rmin)
            s.hi.append(None if rmax is None else offset + rmax)
            s.nonfinite.append(0)
    _keep_ends(session, s, col, steps, parts)


def _point(
    session: Session, job: int, name: str, col: str, steps: tuple[int, int], last: bool
) -> tuple[int, int, float | None] | None:
    """(step, x, value) of the first or last point of a series in the step range."""
    order = "DESC" if last else "ASC"
    row = session.execute(
        text(
            f"SELECT step, {col}, value, flag FROM metric_points WHERE job_id = :j AND name = :n"
            f" AND step BETWEEN :a AND :b AND {col} IS NOT NULL ORDER BY step {order} LIMIT 1"
        ),
        {"j": job, "n": name, "a": steps[0], "b": steps[1]},
    ).one_or_none()
    if row is None:
        return None
    v = value_of(row[2], row[3])
    return int(row[0]), int(row[1]), (v if v is not None and math.isfinite(v) else None)


def _keep_ends(
    session: Session, s: Series, col: str, steps: tuple[int, int], parts: tuple[str, str, float] | None
) -> None:
    """Put the series' exact first point in range before the buckets and its exact last point at the
    line's end (a bucket's x is its last point already, so the last is usually there)."""
    if not s.x:
        return
    for last in (False, True):
        if parts is None:
            p = _point(session, s.job_id, s.name, col, steps, last)
            if p is None:
                continue
            x, v = p[1], p[2]
        else:
            pd = _point(session, s.job_id, parts[1], col, steps, last)
            pn = _point(session, s.job_id, parts[0], col, steps, last)
            if pd is None or pn is None or pd[0] != pn[0]:
                continue
            x = pd[1]
            v = parts[2] + pn[2] / pd[2] if pd[2] and pn[2] is not None else None
        if last and x > s.x[-1]:
            _put(s, len(s.x), x, v)
        elif last and x == s.x[-1] and parts is not None and v is not None:
            # A derived series' last bucket pools several rows; the line ends on the latest point.
            s.y[-1] = v
            s.lo[-1] = v if s.lo[-1] is None else min(s.lo[-1], v)
            s.hi[-1] = v if s.hi[-1] is None else max(s.hi[-1], v)
        elif not last and x < s.x[0]:
            _put(s, 0, x, v)


def _put(s: Series, at: int, x: int, v: float | None) -> None:
    s.x.insert(at, x)
    s.y.insert(at, v)
    s.lo.insert(at, v)
    s.hi.insert(at, v)
    s.nonfinite.insert(at, 0)
