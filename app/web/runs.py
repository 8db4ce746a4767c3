"""Training runs: the runs table, a run's page with live charts, the comparison of several runs, the
chart data and the page's one SSE stream. What a run's files and alerts say (checkpoints, evals,
alarms, drafter truth) is read by app/store/run_figures.py.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from sqlmodel import Session, col, select

from app.serving.endpoints import served_views
from app.store.metric_query import MAX_BUDGET, QueryError, derived_parts, query
from app.store.metrics import last_ids, points_since, summaries, value_of
from app.store.models import TERMINAL, Job, MetricSeries
from app.store.run_figures import (
    RUN_KIND,
    RUNS_SHOWN,
    SHOWN_APART,
    alarms,
    checkpoints,
    evals,
    finite,
    read_json,
    run_out,
    truth,
)
from app.web import sse
from app.web.deps import SessionDep
from app.web.pages import regenerate_with_target, render

router = APIRouter(include_in_schema=False)

MAX_COMPARE = 8
MAX_SOURCE_SERIES = 12  # a chart of more lines than this is unreadable; the table below has them all

# The charts of a run page: (id, title, [(series, label)], y unit). `pos` is filled per run.
CHARTS: list[dict[str, Any]] = [
    {"id": "loss", "title": "Loss", "series": [["train/loss", "train"], ["heldout/loss", "held-out"]]},
    {
        "id": "tau",
        "title": "τ incl. bonus",
        "series": [
            ["heldout/tau_target", "judged by the target (its own answers)"],
            ["heldout/tau_walked", "judged by the data (held-out rows)"],
            ["heldout/tau_anchor", "anchor mean (optimistic)"],
        ],
    },
    {
        "id": "agreement",
        "title": "Target agreement (held-out data)",
        "series": [
            ["heldout/agreement", "greedy token = data's"],
            ["heldout/agreement_expected", "its own T = 1 samples would"],
            ["heldout/target_prob", "mean p(data token)"],
        ],
    },
    {"id": "pos", "title": "Per-position acceptance (train)", "series": []},
    {"id": "lr", "title": "Learning rate", "series": [["train/lr", "lr"]]},
    {"id": "grad", "title": "Gradient norm", "series": [["train/grad_norm", "grad norm"]]},
    {"id": "tps", "title": "Tokens/s", "series": [["train/tokens_per_s", "tokens/s"]]},
    {
        "id": "mem",
        "title": "Peak memory (MiB)",
        "series": [
            ["train/peak_memory_mib", "training steps"],
            ["heldout/peak_memory_mib", "with held-out passes"],
        ],
    },
]


def _run(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None or job.kind != RUN_KIND:
        raise HTTPException(404, f"no training run {job_id}")
    session.refresh(job)
    return job


def _pos_series(job: Job, names: dict[str, MetricSeries]) -> list[list[str]]:
    ks = {int(m[1]) for n in names if (m := re.match(r"^train/pos/(\d+)/total$", n))}
    block = job.params.get("block_size")
    if isinstance(block, int) and 1 < block <= 64:
        ks |= set(range(1, block))
    return [[f"train/pos/{k}/acc", f"k = {k}"] for k in sorted(ks)]


def _source_chart(names: dict[str, MetricSeries]) -> dict[str, Any] | None:
    """τ per source (a mix's sources, or the input files) when the held-out rows come from several:
    which part of the mix the drafter accepts worst, over the run."""
    sources = sorted({m[1] for n in names if (m := re.match(r"^heldout/source/(.+)/walked/steps$", n))})
    if len(sources) < 2:
        return None
    series = [[f"heldout/source/{s}/tau_walked", s.rsplit("/", 1)[-1]] for s in sources[:MAX_SOURCE_SERIES]]
    return {"id": "tau-sources", "title": "τ incl. bonus per source (held-out, judged by the data)",
            "series": series}  # fmt: skip


def _charts(job: Job, names: dict[str, MetricSeries]) -> list[dict[str, Any]]:
    charts = [dict(c) for c in CHARTS]
    next(c for c in charts if c["id"] == "pos")["series"] = _pos_series(job, names)
    by_source = _source_chart(names)
    if by_source is not None:
        charts.insert(next(i for i, c in enumerate(charts) if c["id"] == "tau") + 1, by_source)
    return charts


def latest(names: dict[str, MetricSeries], name: str) -> float | None:
    """The latest value of a stored or derived series from the summaries (no point is read)."""
    parts = derived_parts(name)
    if parts is None:
        s = names.get(name)
        return None if s is None else value_of(s.last_value, s.last_flag)
    num, den = names.get(parts[0]), names.get(parts[1])
    if num is None or den is None or num.last_step != den.last_step:
        return None
    if num.last_value is None or not den.last_value:
        return None
    return parts[2] + num.last_value / den.last_value


def histogram(names: dict[str, MetricSeries]) -> tuple[int | None, list[dict[str, Any]]]:
    """The latest accepted-length histogram (heldout/hist/{n}): (step, [{n, count, share}])."""
    bins = sorted(
        ((int(m[1]), s) for n, s in names.items() if (m := re.match(r"^heldout/hist/(\d+)$", n))),
        key=lambda b: b[0],
    )
    if not bins:
        return None, []
    step = max(s.last_step or 0 for _, s in bins)
    counts = [(n, (s.last_value or 0.0) if s.last_step == step else 0.0) for n, s in bins]
    total = sum(c for _, c in counts) or 1.0
    return step, [{"n": n, "count": c, "share": c / total} for n, c in counts]


def _params(session: Session, job: Job) -> tuple[dict[str, Any], str | None]:
    """What defines the run: run.json when the trainer wrote it, else the job's parameters."""
    data, error = read_json(run_out(job) / "run.json")
    if isinstance(data, dict):
        return data, error
    return dict(job.params), error


def _run_view(session: Session, job: Job, names: dict[str, MetricSeries]) -> dict[str, Any]:
    ckpts, ckpt_error = checkpoints(job)
    ev_rows = evals(session, job, ckpts)
    params, params_error = _params(session, job)
    hist_step, hist = histogram(names)
    return {
        "job": job,
        "terminal": job.status in TERMINAL,
        "out": str(run_out(job)),
        "checkpoints": ckpts,
        "evals": ev_rows,
        "alarms": alarms(session, job, ev_rows),
        "params": params,
        "errors": [e for e in (ckpt_error, params_error, *(r["error"] for r in ev_rows)) if e],
        "hist_step": hist_step,
        "hist": hist,
        "names": names,
        "truth": truth(params, names, ev_rows),
        "served": served_views(session, [job.id or 0]).get(job.id or 0, []),
    }


def _page(request: Request, session: Session, runs: list[Job]) -> HTMLResponse:
    sums = summaries(session, [r.id for r in runs if r.id is not None])
    views = [_run_view(session, r, sums.get(r.id or 0, {})) for r in runs]
    union: dict[str, MetricSeries] = {}
    for v in views:
        union.update(v["names"])
    charts = _charts(runs[0], union)
    keys = sorted({k for v in views for k in v["params"] if k not in SHOWN_APART})
    differing = {k for k in keys if len({json.dumps(v["params"].get(k), sort_keys=True) for v in views}) > 1}
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
        param_keys=keys,
        differing=differing,
        latest=latest,
        regenerate_link=regenerate_with_target(runs[0]),
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
    lo: int | None = None,
    hi: int | None = None,
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
