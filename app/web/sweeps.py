"""The sweep page (/sweeps/{job}): a `sweep` job's points (draftdeck/drafter/eval/sweep.py) as tau against
tokens/s, the Pareto front marked, a table sorted by any column, and the recommended point with the
flags that serve it. Read from the job's stored report (what sweep.json holds); every ratio is computed
here from the stored counts. The chart is drawn here, as SVG the template writes (escaped like any text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse
from sqlmodel import Session, col, select

from app.store.models import Job, JobStatus
from app.store.run_figures import RUN_KIND, RUNS_SHOWN, run_out
from app.web.deps import SessionDep
from app.web.render import render
from draftdeck.drafter.eval.sweep_front import Point

router = APIRouter(include_in_schema=False)

SWEEP_KIND = "sweep"
SWEEPS_SHOWN = 200
# The figures a table column shows: (key, heading, tooltip); a grid parameter's column comes first
FIGURES = (
    ("tau", "τ", "1 + accepted / verify steps (a bonus token every step, as vLLM's counters): carries over"),
    ("verified_per_step", "verified / step", "tokens the target verified per step, its extra work: carries"
     " over"),
    ("tokens_per_s", "tok/s", "speculative decoding's tokens per second on the machine that ran the sweep"),
    ("target_tokens_per_s", "target tok/s", "target-only decoding's tokens per second, the same prompts"),
    ("speedup", "speed-up", "tok/s over target tok/s on that machine: does not carry over from a CPU"),
    ("lossless", "lossless", "greedy: output equal to target-only decoding token for token"),
)  # fmt: skip


@dataclass(frozen=True)
class Axis:
    lo: float
    hi: float
    ticks: list[float]

    def at(self, value: float, start: float, length: float) -> float:
        return start + length * (value - self.lo) / (self.hi - self.lo)


def _axis(values: list[float], floor: float | None = None) -> Axis:
    """A padded range over `values` with round ticks (about five)."""
    lo, hi = min(values), max(values)
    if floor is not None:
        lo = min(lo, floor)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    hi += (hi - lo) * 0.05  # headroom: the highest point's label stays inside the chart
    raw = (hi - lo) / 5
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if step * m >= raw)
    lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
    return Axis(lo, hi, [lo + i * step for i in range(round((hi - lo) / step) + 1)])


@dataclass(frozen=True)
class Chart:
    """The scatter's geometry in a 640 x 360 view box."""

    width = 640
    height = 360
    left = 76
    right = 20
    top = 20
    bottom = 48
    x: Axis
    y: Axis
    dots: list[dict[str, Any]]  # point, cx, cy, front, recommended, lossy, title
    front_line: str  # the SVG polyline through the front, fastest last

    @property
    def plot_w(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> int:
        return self.height - self.top - self.bottom

    def tx(self, v: float) -> float:
        return self.x.at(v, self.left, self.plot_w)

    def ty(self, v: float) -> float:
        return self.y.at(v, self.top + self.plot_h, -self.plot_h)


def chart(points: list[Point], front: list[int], recommended: int | None) -> Chart | None:
    shown = [p for p in points if p.tau is not None and p.tokens_per_s is not None]
    if not shown:
        return None
    x = _axis([p.tokens_per_s or 0.0 for p in shown], floor=0.0)
    y = _axis([p.tau or 0.0 for p in shown], floor=1.0)
    geometry = Chart(x=x, y=y, dots=[], front_line="")
    dots: list[dict[str, Any]] = []
    for p in shown:
        assert p.tau is not None and p.tokens_per_s is not None
        said = ", ".join(f"{k} {'default' if v is None else v}" for k, v in p.params.items())
        dots.append({
            "point": p.point, "cx": geometry.tx(p.tokens_per_s), "cy": geometry.ty(p.tau),
            "front": p.point in front, "recommended": p.point == recommended, "lossy": p.lossless is False,
            "title": f"point {p.point}: {said}; tau {p.tau:.3f}, {p.tokens_per_s:,.0f} tok/s",
        })  # fmt: skip
    on_front = sorted((d for d in dots if d["front"]), key=lambda d: d["cx"])
    line = " ".join(f"{d['cx']:.1f},{d['cy']:.1f}" for d in on_front)
    return Chart(x=x, y=y, dots=dots, front_line=line)


def _value(p: Point, key: str) -> Any:
    """What a column sorts by: a grid parameter's value (`param:NAME`), else a figure of the point."""
    return p.params.get(key.removeprefix("param:")) if key.startswith("param:") else getattr(p, key)


def ordered(points: list[Point], key: str, descending: bool) -> list[Point]:
    """Sorted by a column, points without the figure (None) last whichever the order."""
    known = [p for p in points if _value(p, key) is not None]
    return sorted(known, key=lambda p: _value(p, key), reverse=descending) + [
        p for p in points if _value(p, key) is None
    ]


def sweep_of(session: Session, job_id: int) -> tuple[Job, dict[str, Any]]:
    job = session.get(Job, job_id)
    if job is None or job.kind != SWEEP_KIND:
        raise HTTPException(404, f"no sweep job {job_id}")
    sweep = (job.result or {}).get("sweep")
    if job.status != JobStatus.SUCCEEDED or not isinstance(sweep, dict):
        raise HTTPException(
            409, f"sweep job {job_id} has no result yet ({job.status}): its job page says why"
        )
    return job, sweep


@router.get("/sweeps/{job_id}", response_class=HTMLResponse)
def sweep_page(
    request: Request, job_id: int, session: SessionDep, sort: str = "point", order: str = "asc"
) -> HTMLResponse:
    job, sweep = sweep_of(session, job_id)
    points = [Point.from_json(p) for p in sweep["points"]]
    params = list(sweep["grid"])
    keys = ["point", *(f"param:{k}" for k in params), *(k for k, _, _ in FIGURES)]
    sort = sort if sort in keys else "point"
    best = next((p for p in points if p.point == sweep["recommended"]), None)
    drawn = chart(points, sweep["pareto"], sweep["recommended"])
    return render(request, "sweep.html", session, nav="evals", job=job, sweep=sweep, params=params,
                  points=ordered(points, sort, order == "desc"), figures=FIGURES, sort=sort, order=order,
                  best=best, front=set(sweep["pareto"]), chart=drawn)  # fmt: skip


def run_sweeps(session: Session) -> dict[int, tuple[int, dict[str, Any]]]:
    """Each training run's newest succeeded sweep: run -> (the sweep job, its recommended point's
    parameters), for the leaderboard's link to the run's best sweep point."""
    trains = session.exec(
        select(Job).where(Job.kind == RUN_KIND).order_by(col(Job.id).desc()).limit(RUNS_SHOWN)
    ).all()
    runs = {run_out(t): t.id for t in trains if t.id is not None}
    sweeps = session.exec(
        select(Job)
        .where(Job.kind == SWEEP_KIND, Job.status == JobStatus.SUCCEEDED)
        .order_by(col(Job.id).desc())
        .limit(SWEEPS_SHOWN)
    ).all()
    found: dict[int, tuple[int, dict[str, Any]]] = {}
    for job in sweeps:
        sweep = (job.result or {}).get("sweep") or {}
        best = next(
            (p for p in sweep.get("points") or [] if p.get("point") == sweep.get("recommended")), None
        )
        ckpt = str((job.params.get("inputs") or [""])[0])
        run = next((rid for out, rid in runs.items() if ckpt and Path(ckpt).is_relative_to(out)), None)
        if run is not None and run not in found and best is not None and job.id is not None:
            found[run] = (job.id, best)
    return found
