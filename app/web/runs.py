"""Training runs: the runs table, a run's page with live charts, the comparison of several runs, the
chart data and the page's one SSE stream. What a run's files and alerts say (checkpoints, evals,
alarms, drafter truth) is read by app/store/run_figures.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from sqlmodel import Session, col, select

from app.serving.endpoints import served_views
from app.store.metric_query import MAX_BUDGET, MAX_COORDINATE, QueryError, derived_parts, query
from app.store.metrics import last_ids, points_since, summaries, value_of
from app.store.models import TERMINAL, Job, MetricSeries
from app.store.run_figures import (
    RUN_KIND,
    RUNS_SHOWN,
    alarms,
    checkpoints,
    evals,
    finite,
)
from app.web import sse
from app.web.deps import SessionDep
from app.web.job_views import regenerate_with_target
from app.web.render import render
from app.web.run_compare import side_by_side
from app.web.run_params import param_table
from app.web.run_views import (
    latest,
    run_charts,
    run_view,
)

router = APIRouter(include_in_schema=False)

MAX_COMPARE = 8


def _run(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None or job.kind != RUN_KIND:
        raise HTTPException(404, f"no training run {job_id}")
    session.refresh(job)
    return job


def _page(request: Request, session: Session, runs: list[Job]) -> HTMLResponse:
    sums = summaries(session, [r.id for r in runs if r.id is not None])
    views = [run_view(session, r, sums.get(r.id or 0, {})) for r in runs]
    union: dict[str, MetricSeries] = {}
    for v in views:
        union.update(v["names"])
    charts = run_charts(runs[0], union)
    markers = [  # the eval's own figure, over every prompt it decoded
        {"job": v["job"].id, "eval": e["job"].id, "step": e["step"], "tau": e["real_all"]}
        for v in views
        for e in v["evals"]
        if e["real_all"] is not None and e["step"] is not None
    ]
    return render(
        request,
        "run.html",
        session,
        nav="runs",
        runs=views,
        charts=charts,
        config={
            "jobs": [r.id for r in runs],
            "charts": charts,
            "markers": markers,
            "live": any(not v["terminal"] for v in views),
            "budget_max": MAX_BUDGET,
        },
        param_rows=param_table([v["parameters"] for v in views]),
        latest=latest,
        regenerate_link=regenerate_with_target(runs[0]),
        side=side_by_side(views) if len(views) > 1 else [],
    )


@router.get("/runs", response_class=HTMLResponse)
def runs_page(request: Request, session: SessionDep, q: str = "", status: str = "") -> HTMLResponse:
    stmt = select(Job).where(Job.kind == RUN_KIND)
    if status:
        stmt = stmt.where(Job.status == status)
    jobs_ = list(session.exec(stmt.order_by(col(Job.id).desc()).limit(RUNS_SHOWN)).all())
    needle = q.strip().lower()
    if needle:
        jobs_ = [
            j for j in jobs_ if needle in f"{j.id} {j.status} {json.dumps(j.params, sort_keys=True)}".lower()
        ]
    sums = summaries(session, [j.id for j in jobs_ if j.id is not None])
    served = served_views(session, [j.id for j in jobs_ if j.id is not None])
    rows = []
    for j in jobs_:
        names = sums.get(j.id or 0, {})
        ckpts, _ = checkpoints(j)
        ev_rows = evals(session, j, ckpts)
        step = max((s.last_step or 0 for s in names.values()), default=None)
        rows.append(
            {
                "job": j,
                "step": step,
                "loss": latest(names, "train/loss"),
                "tau": latest(names, "heldout/tau_walked"),
                "target_tau": latest(names, "heldout/tau_target"),
                "best": next((c for c in ckpts if c["best"]), None),
                # the latest checkpoint's eval with a figure: real decoding, in both conventions
                "eval": next((e for e in reversed(ev_rows) if e["real_all"] is not None), None),
                "alarms": alarms(session, j, ev_rows),
                "served": served.get(j.id or 0, []),
            }
        )
    return render(request, "runs.html", session, nav="runs", rows=rows, q=q, status=status)


@router.get("/runs/compare", response_class=HTMLResponse)
def compare_page(request: Request, session: SessionDep, ids: list[int] = Query(default=[])) -> HTMLResponse:
    unique = list(dict.fromkeys(ids))
    if not unique:
        raise HTTPException(400, "pick at least one run to compare (ids=...)")
    if len(unique) > MAX_COMPARE:
        raise HTTPException(400, f"{len(unique)} runs picked: compare at most {MAX_COMPARE}")
    return _page(request, session, [_run(session, i) for i in unique])


@router.get("/runs/data")
def runs_data(
    session: SessionDep,
    jobs: list[int] = Query(default=[]),
    names: list[str] = Query(default=[]),
    x: str = "step",
    lo: Annotated[int | None, Query(ge=0, le=MAX_COORDINATE)] = None,
    hi: Annotated[int | None, Query(ge=0, le=MAX_COORDINATE)] = None,
    budget: int = 1000,
) -> JSONResponse:
    """Chart data: per (job, name) the bucketed line and band, and the cursor to stream from."""
    for j in jobs:
        _run(session, j)
    t0 = time.perf_counter()
    # Cursors first: a point written during the query comes again on the stream (the page drops
    # steps it already has) rather than being missed.
    cursor = {feed_name(j): last for j, last in last_ids(session, jobs).items()}
    try:
        result = query(session, jobs, names, axis=x, lo=lo, hi=hi, budget=budget)
    except QueryError as exc:
        raise HTTPException(400, str(exc)) from None
    body = result.as_json() | {"cursor": cursor}
    ms = (time.perf_counter() - t0) * 1000
    return JSONResponse(body, headers={"Server-Timing": f"app;dur={ms:.1f}"})


def _stored_names(names: Sequence[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        parts = derived_parts(n)
        out.extend([parts[0], parts[1]] if parts else [n])
    return list(dict.fromkeys(out))


def feed_name(job_id: int) -> str:
    """A run's metric feed on the page's stream: its event name and its cursor's key (``m12=4051``)."""
    return f"m{job_id}"


def metric_feed(job_id: int, names: Sequence[str]) -> sse.Feed:
    """New points of one run after an id cursor, as {job, name, step, tokens, time, y} items; a
    derived series (a ratio of counts) gets an item where both its counts have a point at a step."""
    stored = _stored_names(names)
    shown = set(names)
    derived = [(n, parts) for n in names if (parts := derived_parts(n)) is not None]

    def item(name: str, step: int, tokens: int | None, wall: int, y: float | None) -> dict[str, Any]:
        return {"job": job_id, "name": name, "step": step, "tokens": tokens, "time": wall, "y": y}

    def poll(session: Session, cursor: int) -> tuple[list[Any], int]:
        rows, after = points_since(session, job_id, stored, cursor)
        items: list[dict[str, Any]] = []
        at: dict[tuple[str, int], tuple[int | None, int, float | None]] = {}
        for _id, name, step, tokens, wall, value, flag in rows:
            at[(name, step)] = (tokens, wall, value if flag == 0 else None)
            if name in shown:
                y = finite(value_of(value, flag))
                items.append(
                    {"job": job_id, "name": name, "step": step, "tokens": tokens, "time": wall, "y": y}
                )
        for name, (num_name, den_name, offset) in derived:
            for (n, step), (tokens, wall, den) in at.items():
                if n != den_name or (num_name, step) not in at:
                    continue
                num = at[(num_name, step)][2]
                y = offset + num / den if num is not None and den else None
                items.append(
                    {"job": job_id, "name": name, "step": step, "tokens": tokens, "time": wall, "y": y}
                )
        items.sort(key=lambda r: (r["name"], r["step"]))
        return items, after

    return sse.Feed(feed_name(job_id), poll)


def run_stream(jobs: Sequence[int], names: Sequence[str], cursor: sse.Cursor) -> sse.Stream:
    """The run page's stream: one metric feed per run, the runs' statuses, the open-alert count; it
    ends once every run has ended and its last points went out."""

    def statuses(session: Session) -> list[dict[str, Any]]:
        rows = session.exec(select(Job).where(col(Job.id).in_(list(jobs))).order_by(col(Job.id))).all()
        return [{"job": j.id, "status": j.status} for j in rows]

    def ended(values: Any) -> dict[str, Any] | None:
        runs = values["runs"]
        return {"status": "ended"} if all(r["status"] in TERMINAL for r in runs) else None

    return sse.Stream(
        states=[sse.State("runs", statuses), sse.State("alerts", sse.open_alerts)],
        feeds=[metric_feed(j, names) for j in jobs],
        ended=ended,
        cursor=cursor,
    )


@router.get("/runs/stream")
def runs_stream(
    request: Request,
    session: SessionDep,
    jobs: list[int] = Query(default=[]),
    names: list[str] = Query(default=[]),
) -> StreamingResponse:
    """The page's one SSE stream (app/web/sse.py). Events: ``m{job}`` [{job, name, step, tokens, time,
    y}, ...] (new points of a run after the cursor ``m{job}=<point id>`` that GET /runs/data gave,
    or Last-Event-ID on a reconnect), ``runs`` [{job, status}], ``alerts`` {open}, and ``end``."""
    for j in jobs:
        _run(session, j)
    if not names:
        raise HTTPException(400, "name at least one metric to stream")
    stream = run_stream(list(dict.fromkeys(jobs)), list(names), {})
    stream.cursor.update(sse.start_cursor(request, stream.feeds))
    session.close()  # polls open their own short sessions; none is held while the stream waits
    return sse.response(stream)


@router.get("/runs/{job_id}", response_class=HTMLResponse)
def run_page(request: Request, job_id: int, session: SessionDep) -> HTMLResponse:
    return _page(request, session, [_run(session, job_id)])
