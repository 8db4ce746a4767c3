"""Charts of a served drafter: served tau over time, and served p_i beside the eval's and the held-out
walk's, for the run page's Served section and an endpoint's page.

Served tau is bucketed in SQL as the run charts are (app/store/metric_query.py: its grid arithmetic `BUCKET`
and its `Series`): per bucket the sums of the windows' counts, tau incl. bonus = 1 + sum(accepted) /
sum(drafts), never an average of ratios; the band spans the windows' own taus; a bucket with no drafts
is a gap. A range of more windows than ROWS_PER_BUCKET a bucket reads their hourly sums instead
(`ServingHour`, kept by app/serving/endpoints.py as each scrape lands: the same counts, and the min and max of
the windows' taus), so a month charts as fast as a day. SGLang reports gauges, not counts: its accept
length ("last interval") is bucketed with the same arithmetic as a stored series (the bucket's last
value, its min and max), in Python, because a JSON field is read differently by SQLite and PostgreSQL.

p_i (the share of verify steps accepting more than i draft tokens) comes from counts in each case:
the served windows' per-position counters; the eval's `per_pos_accepted_more_than` over its verify
steps; the held-out walk's accepted-length histogram at the checkpoint's step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlmodel import Session, col, select

from app.serving.endpoints import best_eval, figure, newest, own_windows
from app.settings import get_settings
from app.store.metric_query import BUCKET, MAX_BUDGET, ROWS_PER_BUCKET, QueryError, Series
from app.store.models import Job, ServingEndpoint, ServingHour, ServingWindow
from app.store.run_figures import drafter_counts, read_json, run_out
from draftdeck.serving.window import sum_positions

TAU = "served/tau"
ACCEPT_LENGTH = "served/accept_length"  # SGLang's gauge, last interval
RANGE_ROWS = 2_000  # windows in a zoomed range summed for p_i; more: their hours


@dataclass
class Positions:
    """p_0 .. p_{k-1} of one drafter from three sources (None where a source has no count)."""

    served: list[float | None] = field(default_factory=list)
    served_drafts: int = 0
    eval: list[float | None] = field(default_factory=list)
    eval_steps: int = 0
    eval_job: int | None = None
    walked: list[float | None] = field(default_factory=list)
    walked_steps: int = 0
    walked_step: int | None = None

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def tau_series(
    session: Session, ep: ServingEndpoint, lo: int | None = None, hi: int | None = None, budget: int = 500
) -> Series:
    """Served tau incl. bonus (vLLM: from counts) or SGLang's accept length (its gauge) over time, on
    `budget` buckets of [lo, hi] epoch ms (bounds left out: all the endpoint's windows). From the
    windows when they fit `ROWS_PER_BUCKET * budget` rows, else from their hourly sums (level 1)."""
    if not 1 <= budget <= MAX_BUDGET:
        raise QueryError(f"point budget {budget}: must be 1..{MAX_BUDGET}")
    if lo is not None and hi is not None and lo > hi:
        raise QueryError(f"time range {lo}..{hi}: the start is after the end")
    s = Series(ep.id or 0, ACCEPT_LENGTH if ep.kind == "sglang" else TAU)
    lo, hi = _bounds(session, ep, lo, hi)
    if lo is None or hi is None:
        return s
    args = {"e": ep.id, "m": ep.model_name, "lo": lo, "hi": hi, "nb": budget, "span": max(hi - lo, 1)}
    s.level = 1 if windows_in(session, ep, lo, hi, ROWS_PER_BUCKET * budget) > ROWS_PER_BUCKET * budget else 0
    if ep.kind == "sglang":
        _gauge_buckets(s, _gauges(session, ep, lo, hi, hourly=bool(s.level)), args)
        return s
    if s.level:
        table, x, vmin, vmax = "serving_hours", "last_wall_ms", "vmin", "vmax"
    else:
        tau = "CASE WHEN drafts > 0 THEN 1 + CAST(accepted AS FLOAT) / drafts END"
        table, x, vmin, vmax = "serving_windows", "wall_ms", tau, tau
    sql = f"""
    WITH r AS (SELECT {x} AS x, accepted AS a, drafts AS d, {vmin} AS vmin, {vmax} AS vmax
               FROM {table} WHERE endpoint_id = :e AND {x} BETWEEN :lo AND :hi{_of_model(ep)}),
    b AS (SELECT {BUCKET} AS bk, r.* FROM r)
    SELECT bk, MAX(x), SUM(a), SUM(d), MIN(vmin), MAX(vmax) FROM b GROUP BY bk ORDER BY bk"""
    for _bk, x_, a, d, band_lo, band_hi in session.execute(text(sql), args):
        s.x.append(int(x_))
        s.y.append(1 + float(a) / float(d) if d else None)  # PostgreSQL sums BIGINTs as NUMERIC
        s.lo.append(band_lo)
        s.hi.append(band_hi)
        s.nonfinite.append(0)
    return s


def _of_model(ep: ServingEndpoint) -> str:
    """The SQL condition of `serving.own_windows` (``:m`` the endpoint's model), or nothing."""
    return " AND model_name = :m" if ep.model_name else ""


def windows_in(session: Session, ep: ServingEndpoint, lo: int, hi: int, limit: int) -> int:
    """The endpoint's windows in [lo, hi], counted no further than `limit` + 1."""
    sql = (
        "SELECT COUNT(*) FROM (SELECT 1 FROM serving_windows WHERE endpoint_id = :e"
        f" AND wall_ms BETWEEN :lo AND :hi{_of_model(ep)} LIMIT :lim) AS t"
    )
    args = {"e": ep.id, "m": ep.model_name, "lo": lo, "hi": hi, "lim": limit + 1}
    return int(session.execute(text(sql), args).scalar_one())


def _bounds(
    session: Session, ep: ServingEndpoint, lo: int | None, hi: int | None
) -> tuple[int | None, int | None]:
    if lo is not None and hi is not None:
        return lo, hi
    # One end a query: SQLite answers each from the (endpoint_id, wall_ms) index, MIN and MAX together
    # it answers by reading the endpoint's whole index range.
    found = [
        session.execute(
            text(
                f"SELECT wall_ms FROM serving_windows WHERE endpoint_id = :e{_of_model(ep)}"
                f" ORDER BY wall_ms {order} LIMIT 1"
            ),
            {"e": ep.id, "m": ep.model_name},
        ).scalar()
        for order in ("ASC", "DESC")
    ]
    if found[0] is None or found[1] is None:
        return None, None
    return (int(found[0]) if lo is None else lo), (int(found[1]) if hi is None else hi)


def _hours(ep: ServingEndpoint, lo: int, hi: int) -> Any:
    stmt = select(ServingHour).where(
        ServingHour.endpoint_id == ep.id, col(ServingHour.last_wall_ms).between(lo, hi)
    )
    return stmt.where(ServingHour.model_name == ep.model_name) if ep.model_name else stmt


def _gauges(
    session: Session, ep: ServingEndpoint, lo: int, hi: int, hourly: bool
) -> list[tuple[int, float, float, float]]:
    """(x, last, min, max) of SGLang's gauge per window, or per hour, in time order."""
    if hourly:
        hours = session.exec(_hours(ep, lo, hi).order_by(col(ServingHour.last_wall_ms)))
        # vmin and vmax are set with vlast, from the same figures
        return [(h.last_wall_ms, h.vlast, h.vmin, h.vmax) for h in hours if h.vlast is not None]
    rows = session.exec(
        own_windows(ep)
        .where(col(ServingWindow.wall_ms).between(lo, hi))
        .order_by(col(ServingWindow.wall_ms), col(ServingWindow.id))
    )
    return [(w.wall_ms, v, v, v) for w in rows if (v := figure(ep, w)) is not None]


def _gauge_buckets(s: Series, points: list[tuple[int, float, float, float]], args: dict[str, Any]) -> None:
    lo, nb, span = args["lo"], args["nb"], args["span"]
    buckets: dict[int, list[tuple[int, float, float, float]]] = {}
    for p in points:  # `BUCKET`, in Python
        buckets.setdefault(min(max((p[0] - lo) * nb // span, 0), nb - 1), []).append(p)
    for _bk, inside in sorted(buckets.items()):
        s.x.append(inside[-1][0])
        s.y.append(inside[-1][1])
        s.lo.append(min(p[2] for p in inside))
        s.hi.append(max(p[3] for p in inside))
        s.nonfinite.append(0)


def positions(
    session: Session, ep: ServingEndpoint, lo: int | None = None, hi: int | None = None
) -> Positions:
    """p_i served: over [lo, hi], else over the newest windows the served table sums (`chart_data` adds
    the run's own)."""
    out = Positions()
    if lo is None or hi is None:
        w = newest(session, ep, get_settings().serving_min_drafts)
        out.served, out.served_drafts = w.per_position, w.drafts
    else:  # the counts alone, of the windows in range or, past RANGE_ROWS of them, of their hours
        hourly = windows_in(session, ep, lo, hi, RANGE_ROWS) > RANGE_ROWS
        table: Any = ServingHour if hourly else ServingWindow
        x = table.last_wall_ms if hourly else table.wall_ms
        stmt = select(table.drafts, table.per_position).where(table.endpoint_id == ep.id, x.between(lo, hi))
        if ep.model_name:
            stmt = stmt.where(table.model_name == ep.model_name)
        rows = session.execute(stmt).all()
        drafts, per = sum(d for d, _ in rows), sum_positions([p for _, p in rows])
        out.served = [None if n is None or not drafts else n / drafts for n in per]
        out.served_drafts = drafts
    return out


def _run_positions(
    session: Session, run: Job, best: dict[str, Any] | None, row: dict[str, Any] | None, out: Positions
) -> None:
    """p_i of the run's best eval (real decoding) and of its held-out walk (the run's accepted-length
    histogram at the best checkpoint's step)."""
    if row is not None:
        data, _ = read_json(run_out(row["job"]) / "eval.json")
        counts = drafter_counts(data)
        per, steps = counts.get("per_pos_accepted_more_than"), counts.get("verify_steps")
        if isinstance(per, dict) and isinstance(steps, int) and steps > 0:
            out.eval = [per[k] / steps for k in sorted(per, key=int)]
            out.eval_steps, out.eval_job = steps, row["job"].id
    step = best["step"] if best is not None else (row["step"] if row else None)
    hist = _hist_at(session, run.id or 0, step)
    total = sum(hist.values())
    if total:
        k = max(hist) - 1  # the histogram's lengths are 1..B incl. bonus: B - 1 draft positions
        out.walked = [sum(c for n, c in hist.items() if n > i + 1) / total for i in range(k)]
        out.walked_steps, out.walked_step = int(total), step


def _hist_at(session: Session, job_id: int, step: int | None) -> dict[int, float]:
    """heldout/hist/<n> of the newest held-out pass at or before `step` (the newest of all: None)."""
    found = session.execute(
        text(
            "SELECT MAX(step) FROM metric_points WHERE job_id = :j AND name = 'heldout/hist/1' AND step <= :s"
        ),
        {"j": job_id, "s": 2**62 if step is None else step},
    ).scalar()
    if found is None:
        return {}
    step = int(found)
    rows = session.execute(
        text(
            "SELECT name, value FROM metric_points WHERE job_id = :j AND step = :s"
            " AND name LIKE 'heldout/hist/%' AND flag = 0"
        ),
        {"j": job_id, "s": step},
    )
    return {int(name.rsplit("/", 1)[1]): float(v) for name, v in rows if name.rsplit("/", 1)[1].isdigit()}


def chart_data(
    session: Session, ep: ServingEndpoint, lo: int | None = None, hi: int | None = None, budget: int = 500
) -> dict[str, Any]:
    """What GET /serving/<id>/data answers: the tau series, p_i, and the run's figures to draw beside
    them (its best eval's real tau, its best checkpoint's held-out walked taus)."""
    series = tau_series(session, ep, lo, hi, budget)
    pos = positions(session, ep, lo, hi)
    out: dict[str, Any] = {
        "x": "time", "lo": lo, "hi": hi, "budget": budget, "kind": ep.kind, "series": [series.as_json()],
        "eval_tau": None, "eval_job": None, "target_tau": None, "data_tau": None,
    }  # fmt: skip
    run = session.get(Job, ep.run_job_id) if ep.run_job_id is not None else None
    if run is not None:
        best, row = best_eval(session, run)
        _run_positions(session, run, best, row, pos)
        if row is not None:
            out["eval_tau"], out["eval_job"] = row["real"], row["job"].id
        if best is not None:
            out["target_tau"], out["data_tau"] = best["target_tau"], best["tau"]
    out["positions"] = pos.as_json()
    return out
