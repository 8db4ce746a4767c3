"""The leaderboard (/evals): every finished eval of every run, a row each, read from the job's stored
report (the figures eval.json holds, draftdeck/drafter/eval/evaluate.py), filtered and sorted.

Every tau is incl. bonus (as vLLM's counters count); tokens per step is z-lab's benchmark's count. A
suite eval's figures per category are columns `suite/category`; `suite` alone is the suite's whole.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from app.store.models import Job, JobStatus
from app.store.run_figures import EVAL_KIND, RUN_KIND, RUNS_SHOWN, run_out
from draftdeck.drafter.eval.keys import ALL

EVALS_SHOWN = 1000
THINKING = {True: "on", False: "off"}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


@dataclass
class EvalRow:
    job: Job
    run: int | None  # the training run whose checkpoint it evaluated
    target: str
    drafter: str  # the drafter's kind
    prompts: str  # what was decoded: the suites, else the held-out split or the prompt file
    suites: list[str]
    thinking: str  # on, off, or the template's default
    mode: str  # greedy or sampled
    served: float | None  # the served drafter's tau on the same prompts (a served eval)
    tau: float | None
    tokens_per_step: float | None
    per_pos: list[float | None]
    speedup: float | None
    lossless: bool | None
    cells: dict[str, float | None] = field(default_factory=dict)  # "suite/category" and "suite" -> tau

    @property
    def where(self) -> str:
        return "served" if self.served is not None else "offline"

    def value(self, key: str) -> Any:
        """The figure a column sorts by (a cell's key, or a field's name)."""
        return self.cells[key] if key in self.cells else getattr(self, key, None)


def _row(job: Job, runs: dict[Path, int]) -> EvalRow | None:
    ev = (job.result or {}).get("eval")
    if not isinstance(ev, dict) or not isinstance(ev.get("methods"), dict):
        return None
    drafter = ev["methods"].get("drafter") or {}
    params = job.params
    ckpt = str(params.get("checkpoint") or "")
    run = params.get("run") if isinstance(params.get("run"), int) else None
    if run is None and ckpt:
        run = next((rid for out, rid in runs.items() if Path(ckpt).is_relative_to(out)), None)
    kwargs = ev.get("template_kwargs") or params.get("template_kwargs") or {}
    thinking = kwargs.get("enable_thinking")
    suites = ev.get("suites") or {}
    cells: dict[str, float | None] = {}
    for suite, cats in suites.items():
        for cat, fig in cats.items():
            tau = _num(((fig.get("methods") or {}).get("drafter") or {}).get("tau_incl_bonus_pooled"))
            cells[suite if cat == ALL else f"{suite}/{cat}"] = tau
    inputs = params.get("inputs") or []
    prompts = ", ".join(suites) if suites else (Path(str(inputs[0])).name if inputs else "?")
    return EvalRow(
        job=job, run=run, target=str(ev.get("target") or params.get("target") or ""),
        drafter=str(ev.get("drafter") or "dflash"), prompts=prompts, suites=list(suites),
        thinking=THINKING[thinking] if isinstance(thinking, bool) else "default",
        mode=str(ev.get("mode") or "greedy"),
        served=_num((ev.get("served") or {}).get("tau_incl_bonus")),
        tau=_num(drafter.get("tau_incl_bonus_pooled")), tokens_per_step=_num(drafter.get("tokens_per_step")),
        per_pos=[_num(v) for v in drafter.get("per_pos_acceptance") or []],
        speedup=_num(drafter.get("speedup_vs_target_only")),
        lossless=drafter.get("lossless") if isinstance(drafter.get("lossless"), bool) else None, cells=cells,
    )  # fmt: skip


def eval_rows(session: Session) -> list[EvalRow]:
    """Every succeeded eval (the newest EVALS_SHOWN), newest first."""
    trains = session.exec(
        select(Job).where(Job.kind == RUN_KIND).order_by(col(Job.id).desc()).limit(RUNS_SHOWN)
    ).all()
    runs = {run_out(t): t.id for t in trains if t.id is not None}
    jobs = session.exec(
        select(Job)
        .where(Job.kind == EVAL_KIND, Job.status == JobStatus.SUCCEEDED)
        .order_by(col(Job.id).desc())
        .limit(EVALS_SHOWN)
    ).all()
    return [r for r in (_row(j, runs) for j in jobs) if r is not None]


FILTERS = ("target", "drafter", "suite", "thinking", "where")


def choices(rows: Iterable[EvalRow]) -> dict[str, list[str]]:
    """The values each filter can take among `rows`."""
    rows = list(rows)
    return {
        "target": sorted({r.target for r in rows}),
        "drafter": sorted({r.drafter for r in rows}),
        "suite": sorted({s for r in rows for s in r.suites}),
        "thinking": sorted({r.thinking for r in rows}),
        "where": sorted({r.where for r in rows}),
    }


def select_rows(rows: list[EvalRow], picked: dict[str, str]) -> list[EvalRow]:
    """The rows matching every filter given (an empty value: any)."""

    def keep(r: EvalRow) -> bool:
        for name, value in picked.items():
            if not value:
                continue
            have = r.suites if name == "suite" else [str(getattr(r, name))]
            if value not in have:
                return False
        return True

    return [r for r in rows if keep(r)]


def cell_columns(rows: list[EvalRow], suite: str) -> list[str]:
    """Per-suite columns: with one suite picked, its categories then its whole; else each suite's whole."""
    if suite:
        cats = sorted({k for r in rows for k in r.cells if k.startswith(suite + "/")})
        return [*cats, suite]
    return sorted({k for r in rows for k in r.cells if "/" not in k})


def sort_rows(rows: list[EvalRow], key: str, descending: bool) -> list[EvalRow]:
    """Sorted by `key` (rows without that figure last, whichever the direction)."""
    have = [r for r in rows if r.value(key) is not None]
    missing = [r for r in rows if r.value(key) is None]
    return sorted(have, key=lambda r: r.value(key), reverse=descending) + missing


BASE_COLUMNS = ("job", "run", "target", "drafter", "prompts", "thinking", "mode", "where", "tau",
                "tokens_per_step", "speedup", "lossless", "served")  # fmt: skip


# A spreadsheet runs a cell that starts so as a formula (=HYPERLINK(...), +cmd|...): OWASP's rule for CSV
# injection puts a quote before such a text cell, which the spreadsheet shows as text
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """`value` as a CSV cell: empty for None, a text cell a spreadsheet would run made inert."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def to_csv(rows: list[EvalRow], cells: list[str]) -> str:
    """The table as CSV: the page's columns, each tau incl. bonus (vLLM's convention), per-position
    acceptance as `pos1`, `pos2`, ... (the drafts accepted past position k, over verify steps). Text
    cells that a spreadsheet would read as a formula start with a quote (:func:`csv_cell`)."""
    width = max((len(r.per_pos) for r in rows), default=0)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([*BASE_COLUMNS, *[f"pos{k + 1}" for k in range(width)], *cells])
    for r in rows:
        base = [r.job.id if c == "job" else getattr(r, c) for c in BASE_COLUMNS]
        pos = [*r.per_pos, *[None] * (width - len(r.per_pos))]
        w.writerow([csv_cell(v) for v in [*base, *pos, *[r.cells.get(c) for c in cells]]])
    return buf.getvalue()
