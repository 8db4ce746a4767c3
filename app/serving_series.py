"""Charts of a served drafter: served tau over time, and served p_i beside the eval's and the held-out
walk's, for the run page's Served section and an endpoint's page.

Served tau is bucketed in SQL as the run charts are (app/metric_query.py: its grid arithmetic `BUCKET`
and its `Series`): per bucket the sums of the windows' counts, tau incl. bonus = 1 + sum(accepted) /
sum(drafts), never an average of ratios; the band spans the windows' own taus; a bucket with no drafts
is a gap. SGLang reports gauges, not counts: its accept length ("last interval") is bucketed with the
same arithmetic as a stored series (the bucket's last value, its min and max), in Python, because a
JSON field is read differently by SQLite and PostgreSQL.

p_i (the share of verify steps accepting more than i draft tokens) comes from counts in each case:
the served windows' per-position counters; the eval's `per_pos_accepted_more_than` over its verify
steps; the held-out walk's accepted-length histogram at the checkpoint's step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlmodel import Session, col

from app.metric_query import BUCKET, MAX_BUDGET, QueryError, Series
from app.models import Job, ServingEndpoint, ServingWindow
from app.run_figures import checkpoints, read_json, run_out
from app.serving import best_eval, newest, own_windows, summed
from app.settings import get_settings

TAU = "served/tau"
ACCEPT_LENGTH = "served/accept_length"  # SGLang's gauge, last interval
RANGE_ROWS = 50_000  # windows summed for p_i over a zoomed range, newest first


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
    `budget` buckets of [lo, hi] epoch ms (bounds left out: all the endpoint's windows)."""
    if not 1 <= budget <= MAX_BUDGET:
        raise QueryError(f"point budget {budget}: must be 1..{MAX_BUDGET}")
    if lo is not None and hi is not None and lo > hi:
        raise QueryError(f"time range {lo}..{hi}: the start is after the end")
    s = Series(ep.id or 0, ACCEPT_LENGTH if ep.kind == "sglang" else TAU)
    lo, hi = _bounds(session, ep, lo, hi)
    if lo is None or hi is None:
        return s
    args = {"e": ep.id, "m": ep.model_name, "lo": lo, "hi": hi, "nb": budget, "span": max(hi - lo, 1)}
    if ep.kind == "sglang":
        _gauge_buckets(session, s, ep, args)
        return s
    sql = f"""
    WITH r AS (SELECT wall_ms AS x, accepted AS a, drafts AS d,
                      CASE WHEN drafts > 0 THEN CAST(accepted AS FLOAT) / drafts END AS ratio
               FROM serving_windows WHERE endpoint_id = :e AND wall_ms BETWEEN :lo AND :hi{_of_model(ep)}),
    b AS (SELECT {BUCKET} AS bk, r.* FROM r)
    SELECT bk, MAX(x), SUM(a), SUM(d), MIN(ratio), MAX(ratio) FROM b GROUP BY bk ORDER BY bk"""
    for _bk, x, a, d, rmin, rmax in session.execute(text(sql), args):
        s.x.append(int(x))
        s.y.append(1 + float(a) / float(d) if d else None)  # PostgreSQL sums BIGINTs as NUMERIC
        s.lo.append(None if rmin is None else 1 + rmin)
        s.hi.append(None if rmax is None else 1 + rmax)
        s.nonfinite.append(0)
    return s


def _of_model(ep: ServingEndpoint) -> str:
    """The SQL condition of `serving.own_windows` (``:m`` the endpoint's model), or nothing."""
    return " AND model_name = :m" if ep.model_name else ""


def _bounds(
    session: Session, ep: ServingEndpoint, lo: int | None, hi: int | None
) -> tuple[int | None, int | None]:
    if lo is not None and hi is not None:
        return lo, hi
    found = session.execute(
        text(f"SELECT MIN(wall_ms), MAX(wall_ms) FROM serving_windows WHERE endpoint_id = :e{_of_model(ep)}"),
        {"e": ep.id, "m": ep.model_name},
    ).one()
    if found[0] is None:
        return None, None
    return (int(found[0]) if lo is None else lo), (int(found[1]) if hi is None else hi)


def _gauge_buckets(session: Session, s: Series, ep: ServingEndpoint, args: dict[str, Any]) -> None:
    rows = [
        (w.wall_ms, w.gauges)
        for w in session.exec(
            own_windows(ep)
            .where(col(ServingWindow.wall_ms).between(args["lo"], args["hi"]))
            .order_by(col(ServingWindow.wall_ms), col(ServingWindow.id))
        )
    ]
    lo, nb, span = args["lo"], args["nb"], args["span"]
    buckets: dict[int, list[tuple[int, float]]] = {}
    for wall_ms, gauges in rows:
        v = (gauges or {}).get("accept_length")
        if v is not None:  # `BUCKET`, in Python
            buckets.setdefault(min(max((wall_ms - lo) * nb // span, 0), nb - 1), []).append((wall_ms, v))
    for _bk, points in sorted(buckets.items()):
        values = [v for _, v in points]
        s.x.append(points[-1][0])
        s.y.append(values[-1])
        s.lo.append(min(values))
        s.hi.append(max(values))
        s.nonfinite.append(0)


def positions(
    session: Session, ep: ServingEndpoint, lo: int | None = None, hi: int | None = None
) -> Positions:
    """p_i served (over [lo, hi], else the newest windows the served table sums), and of the run's
    best-checkpoint eval (real decoding) and held-out walk (the run's accepted-length histogram)."""
    out = Positions()
    if lo is not None and hi is not None:
        rows = list(
            session.exec(
                own_windows(ep)
                .where(col(ServingWindow.wall_ms).between(lo, hi))
                .order_by(col(ServingWindow.wall_ms).desc())
                .limit(RANGE_ROWS)
            )
        )
        w = summed(rows)
    else:
        w = newest(session, ep, get_settings().serving_min_drafts)
    out.served, out.served_drafts = w.per_position, w.drafts
    run = session.get(Job, ep.run_job_id) if ep.run_job_id is not None else None
    if run is not None:
        _eval_positions(session, run, out)
    return out


def _eval_positions(session: Session, run: Job, out: Positions) -> None:
    best, row = best_eval(session, run)
    if row is not None:
        data, _ = read_json(run_out(row["job"]) / "eval.json")
        counts = _dig(data, "eval", "methods", "drafter", "counts")
        per, steps = counts.get("per_pos_accepted_more_than"), counts.get("verify_steps")
        if isinstance(per, dict) and isinstance(steps, int) and steps > 0:
            out.eval = [per[k] / steps for k in sorted(per, key=int)]
            out.eval_steps, out.eval_job = steps, row["job"].id
    step = best if best is not None else (row["step"] if row else None)
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


def _dig(data: Any, *keys: str) -> dict[str, Any]:
    for k in keys:
        data = data.get(k) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def chart_data(
    session: Session, ep: ServingEndpoint, lo: int | None = None, hi: int | None = None, budget: int = 500
) -> dict[str, Any]:
    """What GET /serving/<id>/data answers: the tau series, p_i, and the run's figures to draw beside
    them (its best eval's real tau, its best checkpoint's held-out walked taus)."""
    series = tau_series(session, ep, lo, hi, budget)
    out: dict[str, Any] = {
        "x": "time", "lo": lo, "hi": hi, "budget": budget, "kind": ep.kind,
        "series": [series.as_json()], "positions": positions(session, ep, lo, hi).as_json(),
        "eval_tau": None, "eval_job": None, "target_tau": None, "data_tau": None,
    }  # fmt: skip
    run = session.get(Job, ep.run_job_id) if ep.run_job_id is not None else None
    if run is not None:
        best, row = best_eval(session, run)
        if row is not None:
            out["eval_tau"], out["eval_job"] = row["real"], row["job"].id
        ckpts, _ = checkpoints(run)
        ckpt = next((c for c in ckpts if c["step"] == best), None)
        if ckpt is not None:
            out["target_tau"], out["data_tau"] = ckpt["target_tau"], ckpt["tau"]
    return out
