"""What a run's page shows, built from its metric summaries and its files: the charts and their series, the
latest values, the accepted-length histogram, the run's parameters and figures. Routes are in
app/web/runs.py."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlmodel import Session

from app.serving.endpoints import served_views
from app.store.metric_query import derived_parts
from app.store.metrics import value_of
from app.store.models import TERMINAL, Job, MetricSeries
from app.store.run_figures import (
    RUN_KIND,
    alarms,
    checkpoints,
    evals,
    read_json,
    run_out,
    truth,
)
from app.web.run_compare import drafter_kind, drafter_label, vocabulary_note
from app.web.run_params import option_names, run_parameters

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
    {
        "id": "pos-draft-prob",
        "title": "Per-position acceptance, target sampling at T = 1 (held-out: p of the draft)",
        "series": [],
    },
    {
        "id": "pos-expected",
        "title": "Per-position acceptance, both sampling at T = 1 (held-out: Σ min(p, q))",
        "series": [],
    },
    {"id": "lr", "title": "Learning rate", "series": [["train/lr", "lr"]]},
    {"id": "grad", "title": "Gradient norm", "series": [["train/grad_norm", "grad norm"]]},
    {"id": "tps", "title": "Tokens/s", "series": [["train/tokens_per_s", "tokens/s"]]},
    {
        "id": "seconds",
        "title": "Seconds",
        "series": [["train/step_seconds", "a training step"], ["heldout/seconds", "a held-out pass"]],
    },
    {
        "id": "mem",
        "title": "Peak memory (MiB)",
        "series": [
            ["train/peak_memory_mib", "training steps"],
            ["heldout/peak_memory_mib", "with held-out passes"],
        ],
    },
]


def pos_series(job: Job, names: dict[str, MetricSeries]) -> list[list[str]]:
    ks = {int(m[1]) for n in names if (m := re.match(r"^train/pos/(\d+)/total$", n))}
    try:
        block = drafter_kind(job.params).slots(job.params)  # 1 + the drafts a step proposes
    except (TypeError, ValueError):  # parameters of no shape this version reads: the series alone
        block = 0
    if 1 < block <= 64:
        ks |= set(range(1, block))
    return [[f"train/pos/{k}/acc", f"k = {k}"] for k in sorted(ks)]


def source_chart(names: dict[str, MetricSeries]) -> dict[str, Any] | None:
    """τ per source (a mix's sources, or the input files) when the held-out rows come from several:
    which part of the mix the drafter accepts worst, over the run."""
    sources = sorted({m[1] for n in names if (m := re.match(r"^heldout/source/(.+)/walked/steps$", n))})
    if len(sources) < 2:
        return None
    series = [[f"heldout/source/{s}/tau_walked", s.rsplit("/", 1)[-1]] for s in sources[:MAX_SOURCE_SERIES]]
    return {"id": "tau-sources", "title": "τ incl. bonus per source (held-out, judged by the data)",
            "series": series}  # fmt: skip


def expected_series(names: dict[str, MetricSeries], measure: str) -> list[list[str]]:
    """A held-out expected acceptance per slot (`measure`: expected, draft_prob), where measured."""
    ks = {int(m[1]) for n in names if (m := re.match(r"^heldout/pos/(\d+)/accept_total$", n))}
    return [[f"heldout/pos/{k}/{measure}", f"k = {k}"] for k in sorted(ks)]


def run_charts(job: Job, names: dict[str, MetricSeries]) -> list[dict[str, Any]]:
    charts = [dict(c) for c in CHARTS]
    next(c for c in charts if c["id"] == "pos")["series"] = pos_series(job, names)
    for chart_id, measure in (("pos-draft-prob", "draft_prob"), ("pos-expected", "expected")):
        series = expected_series(names, measure)
        if series:
            next(c for c in charts if c["id"] == chart_id)["series"] = series
        else:  # a run from before the measure, or before its first held-out pass
            charts = [c for c in charts if c["id"] != chart_id]
    by_source = source_chart(names)
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


def kind_params(params: Mapping[str, Any], trains: Mapping[str, Any]) -> dict[str, Any]:
    """`params` less the options of the drafter kinds other than the one the train job of parameters
    `trains` trains: its parameters hold every kind's options (draftdeck.drafter.kinds.Options), the
    others' unused defaults, so a DFlash run lists no ttt_steps. The kind's own option groups
    (`DrafterKind.options`) and the fields every run has stay. (run.json's `drafter` is the drafter's
    config, not its kind: the kind is read from the job's parameters.)"""
    _, others = option_names(trains)
    return {k: v for k, v in params.items() if k not in others}


def shown_params(job: Job) -> dict[str, Any]:
    """The parameters a job page lists: a train job's for its own drafter kind, any other job's all."""
    return kind_params(job.params, job.params) if job.kind == RUN_KIND else dict(job.params)


def run_params(session: Session, job: Job) -> tuple[dict[str, Any], str | None]:
    """What defines the run: run.json when the trainer wrote it, else the job's parameters."""
    data, error = read_json(run_out(job) / "run.json")
    if isinstance(data, dict):
        return data, error
    return dict(job.params), error


def run_view(session: Session, job: Job, names: dict[str, MetricSeries]) -> dict[str, Any]:
    ckpts, ckpt_error = checkpoints(job)
    ev_rows = evals(session, job, ckpts)
    params, params_error = run_params(session, job)
    hist_step, hist = histogram(names)
    return {
        "job": job,
        "drafter": drafter_label(job.params),
        "vocabulary": vocabulary_note(params),
        "terminal": job.status in TERMINAL,
        "out": str(run_out(job)),
        "checkpoints": ckpts,
        "evals": ev_rows,
        "alarms": alarms(session, job, ev_rows),
        "params": kind_params(params, job.params),  # run.json's own fields; truth reads them all
        "parameters": run_parameters(params, job.params),  # the Parameters table's, broken out
        "errors": [e for e in (ckpt_error, params_error, *(r["error"] for r in ev_rows)) if e],
        "hist_step": hist_step,
        "hist": hist,
        "names": names,
        "truth": truth(params, names, ev_rows),
        "served": served_views(session, [job.id or 0]).get(job.id or 0, []),
    }
