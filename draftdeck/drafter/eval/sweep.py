"""The `sweep` job: a drafter checkpoint evaluated at every point of a grid of eval options, on the same
prompts, and what that says about serving it: tau against tokens/s per point, the Pareto front of the
two, and the recommended point with the vLLM and SGLang flags that serve it (sweep_front.py).

Each point is a whole `eval` (evaluate.run_eval) with its own eval.json under `points/N/`: every eval
option, the ones added after this was written included, means at a point exactly what it means to the
eval, and a point's row is its eval's counts. `sweep.json` holds one row of counts per point (tau and
speeds are ratios computed when shown), the front, the recommendation and its rule.

What a CPU's tokens/s says: a CPU target pays for every token it verifies, a GPU verifies a block or a
tree of tens of tokens for about the price of one. tau and verified tokens per step carry over to a GPU;
tokens/s and the speed-up measured here do not (NOTE, shown on the sweep page).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftdeck.drafter.eval.sweep_front import (
    RULE,
    Point,
    clock_of,
    pareto_front,
    recommend,
    serving_flags,
)
from draftdeck.drafter.eval.sweep_params import TREE_SHAPE, SweepBase
from draftdeck.fileio import atomic_output, sha256_file
from draftdeck.jobs.context import RunContext
from draftdeck.quality import Output, Report

NOTE = (
    "A CPU target pays for every token it verifies;"
    " a GPU verifies a block or a tree of tens of tokens for about the price of one. So tau and the"
    " verified tokens per step carry over to a GPU; tokens/s and the speed-up do not (on a GPU, a point"
    " verifying more tokens per step loses less than it does here)."
)


@dataclass
class PointContext:
    """The sweep's context as one point's eval sees it: its log lines and alerts name the point; its
    metric points (per prompt) stay in its eval.json; its progress counts on from the points before it
    (every point decodes the same prompts)."""

    ctx: RunContext
    label: str
    out_dir: Path
    before: int  # points done before this one
    points: int

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        if total:
            self.ctx.progress(self.before * total + done, self.points * total, unit)
        self.ctx.check_cancelled()

    def check_cancelled(self) -> None:
        self.ctx.check_cancelled()

    def event(self, level: str, message: str, *, code: str | None = None, count: int = 1) -> None:
        self.ctx.event(level, f"{self.label}: {message}", code=code, count=count)

    def metrics(self, step: int, values: Any, *, tokens: int | None = None) -> None:
        pass  # per-prompt counts of one point: its eval.json holds them all

    def alert(self, kind: str, message: str) -> None:
        self.ctx.alert(kind, f"{self.label}: {message}")


def label(point: dict[str, Any]) -> str:
    """A point in words; a chain's unset tree shape left out."""
    return ", ".join(
        f"{k} {'default' if v is None else v}"
        for k, v in point.items()
        if not (v is None and k in TREE_SHAPE)
    )


def run_sweep(params: SweepBase, ctx: RunContext) -> Report:
    """Evaluate every grid point; write `<out>/sweep.json`; return the report (one row per point)."""
    from draftdeck.drafter.eval.evaluate import Loaded, run_eval

    out_dir = Path(params.out) if params.out is not None else ctx.out_dir
    points = params.points()
    report = Report(rows_in=len(points))
    ctx.event("info", f"sweeping {len(points)} points of {', '.join(params.axes())}")
    rows: list[Point] = []
    device = ""
    loaded: Loaded = {}  # the target and the checkpoint, loaded for the first point, kept for the rest
    for n, point in enumerate(points):
        ctx.check_cancelled()
        where = out_dir / "points" / str(n)
        name = f"point {n + 1}/{len(points)} ({label(point)})"
        done = run_eval(
            params.point_params(point, where), PointContext(ctx, name, where, n, len(points)), loaded
        )
        ev = done.extra["eval"]
        prov = ev.get("provenance") or {}
        device = str(prov.get("gpu") or prov.get("device") or "")
        rows.append(Point.from_eval(n, point, f"points/{n}/eval.json", ev, clock_of(str(prov.get("device")))))
        report.rows_out += 1
    best = recommend(rows)
    checkpoint, target = params.inputs[0], str(params.shared()["target"])
    report.extra["sweep"] = {
        "tau_label": "tau incl. bonus = (accepted draft tokens + verify steps) / verify steps",
        "checkpoint": checkpoint,
        "target": target,
        "grid": params.axes(),
        "shared": {k: v for k, v in params.shared().items() if k not in ("checkpoint",)},
        "points": [p.to_json() for p in rows],
        "pareto": [p.point for p in pareto_front(rows)],
        "recommended": best.point if best is not None else None,
        "rule": RULE,
        "serving": serving_flags(best, checkpoint, target) if best is not None else [],
        "device": device,  # where tokens/s were measured: cpu, or the GPU's name
        "clock": clock_of(device),  # tokens/s per CPU second on a CPU, per wall-clock second on a GPU
        "note": NOTE,
    }
    path = out_dir / "sweep.json"
    with atomic_output(path, "w") as fh:
        fh.write(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
    report.outputs.append(Output(str(path), report.rows_out, path.stat().st_size, sha256_file(path)))
    report.check_accounting()
    return report
