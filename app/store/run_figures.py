"""What a training run's files and alerts say about it, for its pages: checkpoints with their held-out
taus (judged by the target and by the data), its evals against real decoding, its alarms, and its
"Drafter truth" (run.json's pre-flight findings, the latest taus, per source, with the latest eval's
real tau per source beside them).

Files read from the run's output folder: `run.json`, `checkpoints/index.json`, and each eval's
`eval.json`. Every tau is incl. bonus. Judged by the target: the walk over the target's own greedy
answers to held-out prompts (what greedy decoding gets); judged by the data: the walk over the
held-out rows (real tau only when they are the target's greedy output). draftdeck/drafter/train/truth.py
says why.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from app.settings import get_settings
from app.store.models import Alert, Job, MetricSeries

RUNS_SHOWN = 200
RUN_KIND = "train"
EVAL_KIND = "eval"
# a training tau this far from real decoding (relative to real) raises the alarm, unless the eval
# recorded the tolerances it used: the target-judged tau (the eval's tau_tolerance) and the
# data-judged one, above real only (off_target_tolerance)
MISMATCH = 0.05
OFF_TARGET_MISMATCH = 0.10
# alerts that say real decoding and a training figure disagree, or that the data is not the target's
# (tau_mismatch: what decoder_mismatch was called before)
ALARM_KINDS = ("data_not_target_output", "training_estimate_off", "decoder_mismatch", "tau_mismatch")
# run.json keys the page shows in a panel of their own, not as parameters
SHOWN_APART = {"truth", "memory", "provenance"}
_STEP_DIR = re.compile(r"step-0*(\d+)")


def run_out(job: Job) -> Path:
    """The run's output folder: its `out` parameter, else the job's own folder."""
    out = job.params.get("out")
    return Path(out) if isinstance(out, str) and out else get_settings().jobs_dir / str(job.id)


def read_json(path: Path) -> tuple[Any, str | None]:
    """(data, None), (None, None) when the file is absent, or (None, why) when it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{path}: {exc}"


def _tau(accepted: Any, steps: Any) -> float | None:
    try:
        a, s = float(accepted), float(steps)
    except (TypeError, ValueError):
        return None
    return 1.0 + a / s if s > 0 else None


def checkpoints(job: Job) -> tuple[list[dict[str, Any]], str | None]:
    """The run's checkpoints (step, path, walked tau incl. bonus, best) from checkpoints/index.json."""
    data, error = read_json(run_out(job) / "checkpoints" / "index.json")
    if data is None:
        return [], error
    if not isinstance(data, dict) or not isinstance(data.get("checkpoints"), list):
        return [], f"{run_out(job) / 'checkpoints' / 'index.json'}: no 'checkpoints' list"
    best = data.get("best")
    rows = []
    for c in data["checkpoints"]:
        if not isinstance(c, dict) or not isinstance(c.get("step"), int):
            continue
        rows.append(
            {
                "step": c["step"],
                "path": str(c.get("path", "")),
                "tau": _tau(c.get("heldout_walked_accepted"), c.get("heldout_walked_steps")),
                "target_tau": _tau(
                    c.get("heldout_target_walked_accepted"), c.get("heldout_target_walked_steps")
                ),
                "best": c["step"] == best,
            }
        )
    return sorted(rows, key=lambda r: r["step"]), None


def _eval_section(data: Any) -> dict[str, Any]:
    """The figures of an eval.json (draftdeck/drafter/eval/evaluate.py writes them under "eval")."""
    section = data.get("eval") if isinstance(data, dict) else None
    return section if isinstance(section, dict) else {}


def finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _method(data: Any, name: str) -> dict[str, Any]:
    method = (_eval_section(data).get("methods") or {}).get(name)
    return method if isinstance(method, dict) else {}


def _real_tau(data: Any, method: str = "drafter") -> float | None:
    """A method's real tau incl. bonus, pooled over every verify step of the eval (the drafter's, or a
    baseline's: the untrained drafter, prompt lookup)."""
    return finite(_method(data, method).get("tau_incl_bonus_pooled"))


def _speedup(data: Any) -> float | None:
    """The drafter's wall-clock tokens/s over target-only decoding's, from the two rates the eval
    measured on the same prompts."""
    plain = finite((_eval_section(data).get("target_only") or {}).get("tokens_per_s"))
    drafted = finite(_method(data, "drafter").get("tokens_per_s"))
    return drafted / plain if drafted is not None and plain else None


def drafter_counts(data: Any) -> dict[str, Any]:
    """The drafter's counts in an eval.json (verify steps, accepted, per position...; an eval.json from
    before they were stored has none)."""
    counts = ((_eval_section(data).get("methods") or {}).get("drafter") or {}).get("counts")
    return counts if isinstance(counts, dict) else {}


def _tokens_per_step(data: Any) -> float | None:
    """The drafter's tokens per verify step over every step of the eval (z-lab's convention), from its
    counts."""
    counts = drafter_counts(data)
    produced, steps = counts.get("produced_by_steps"), counts.get("verify_steps")
    return produced / steps if isinstance(produced, int) and isinstance(steps, int) and steps else None


def _served_tau(data: Any) -> float | None:
    """Served tau incl. bonus of a served eval: the same prompts through the served drafter."""
    served = _eval_section(data).get("served")
    return finite(served.get("tau_incl_bonus")) if isinstance(served, dict) else None


def _training(data: Any) -> dict[str, Any]:
    """The run's figures for the evaluated checkpoint, as the eval compared them (eval.json)."""
    section = _eval_section(data).get("training")
    return section if isinstance(section, dict) else {}


def _by_source(data: Any) -> dict[str, float | None]:
    """The drafter's real tau incl. bonus per source (eval.json's `by_source` counts, the ratio made here)."""
    raw = _eval_section(data).get("by_source")
    if not isinstance(raw, dict):
        return {}
    return {str(k): _tau(v.get("accepted"), v.get("steps")) for k, v in raw.items() if isinstance(v, dict)}


def _gap(tau: float | None, real: float | None) -> float | None:
    return (tau - real) / real if tau is not None and real else None


def evals(session: Session, job: Job, ckpts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's eval jobs with their checkpoint step, real tau (eval.json) and the run's held-out taus
    of the same checkpoint, judged by the target and by the data (the eval's own record of them,
    else the checkpoint index); a gap above the tolerances is an alarm (data-judged: only above real, as
    the target's own sampled answers give a data-judged tau below it)."""
    out = run_out(job)
    by_step = {c["step"]: c for c in ckpts}
    rows = []
    for ev in session.exec(
        select(Job).where(Job.kind == EVAL_KIND).order_by(col(Job.id).desc()).limit(RUNS_SHOWN)
    ).all():
        ckpt = str(ev.params.get("checkpoint") or "")
        if ev.params.get("run") != job.id and not (ckpt and Path(ckpt).is_relative_to(out)):
            continue
        m = _STEP_DIR.search(Path(ckpt).name) if ckpt else None
        step = int(m[1]) if m else None
        if step is None and ckpt and Path(ckpt) == out:  # the run folder: its best checkpoint was used
            step = next((c["step"] for c in ckpts if c.get("best")), None)
        data, error = read_json(run_out(ev) / "eval.json")
        training = _training(data)
        real_all = _real_tau(data)
        # the figure the eval compared: real tau on the prompts the run's target answered, if it decoded them
        real = finite(training.get("real_tau_incl_bonus")) or real_all
        ckpt_row = by_step.get(step, {})
        walked = finite(training.get("data_judged_tau_incl_bonus")) or ckpt_row.get("tau")
        judged = finite(training.get("target_judged_tau_incl_bonus")) or ckpt_row.get("target_tau")
        diff, target_diff = _gap(walked, real), _gap(judged, real)
        tol = finite(training.get("tolerance")) or MISMATCH
        off_tol = finite(training.get("off_target_tolerance")) or OFF_TARGET_MISMATCH
        mismatch = (diff is not None and diff > off_tol) or (
            target_diff is not None and abs(target_diff) > tol
        )
        rows.append(
            {
                "job": ev,
                "step": step,
                "real": real,
                "real_all": real_all,
                "tokens_per_step": _tokens_per_step(data),
                "speedup": _speedup(data),
                "untrained": _real_tau(data, "untrained"),
                "prompt_lookup": _real_tau(data, "prompt_lookup"),
                "served": _served_tau(data),
                "real_over": training.get("real_over"),
                "walked": walked,
                "target": judged,
                "diff": diff,
                "target_diff": target_diff,
                "mismatch": mismatch,
                "error": error,
                "by_source": _by_source(data),
                # what was decoded, when not the run's held-out prompts: suites, and the template's settings
                "suites": ", ".join(_eval_section(data).get("suites") or {}),
                "template_kwargs": _eval_section(data).get("template_kwargs") or {},
            }
        )
    return sorted(rows, key=lambda r: (r["step"] is None, r["step"] or 0, r["job"].id))


def alarms(session: Session, job: Job, ev_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What says the run's tau is not what decoding gets: the evals whose real tau is apart from the
    run's figures, and the alerts of ALARM_KINDS raised for the run (its pre-flight and held-out
    passes) or its evals (each message names its figures)."""
    keys = ("step", "real", "walked", "target", "diff", "target_diff")
    found = [{"job": r["job"].id, **{k: r[k] for k in keys}} for r in ev_rows if r["mismatch"]]
    ids = [job.id] + [r["job"].id for r in ev_rows]
    alerted = session.exec(
        select(Alert)
        .where(col(Alert.kind).in_(ALARM_KINDS), col(Alert.job_id).in_(ids))
        .order_by(col(Alert.id))
    ).all()
    seen = {a["job"] for a in found}
    for a in alerted:
        if a.job_id not in seen:
            seen.add(a.job_id)
            found.append({"job": a.job_id, "kind": a.kind, "real": None, "message": a.message})
    return found


def truth(
    params: dict[str, Any], names: dict[str, MetricSeries], ev_rows: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """What the run page's "Drafter truth" panel shows: the pre-flight's findings (run.json), the latest
    held-out taus both ways and agreement, and per source when the rows come from several, with the
    real tau per source of the run's latest eval that measured one (`ev_rows`: :func:`evals`)."""
    raw = params.get("truth")
    found: dict[str, Any] = raw if isinstance(raw, dict) else {}
    pre = found.get("preflight") if isinstance(found.get("preflight"), dict) else None
    sources: dict[str, dict[str, float | None]] = {}
    for name in names:
        m = re.match(r"^heldout/source/(.+)/walked/steps$", name)
        if m:
            base = f"heldout/source/{m[1]}"
            sources[m[1]] = {
                "walked": _latest_ratio(names, f"{base}/walked/accepted", f"{base}/walked/steps", 1.0),
                "target": _latest_ratio(
                    names, f"{base}/target_walked/accepted", f"{base}/target_walked/steps", 1.0
                ),
                "agreement": _latest_ratio(
                    names, f"{base}/agreement/matches", f"{base}/agreement/tokens", 0.0
                ),
            }
    latest = max((r for r in ev_rows if r.get("by_source")), key=lambda r: r["job"].id, default=None)
    real = latest["by_source"] if latest else {}
    for name in {*sources, *real}:
        sources.setdefault(name, {"walked": None, "target": None, "agreement": None})["real"] = real.get(name)
    return {
        "provenance": found.get("provenance"),
        "alert": found.get("alert"),
        "reasons": found.get("reasons") or [],
        "answered": found.get("target_answered_prompts"),
        "preflight": None if not pre or not pre.get("tokens") else {
            "tokens": pre["tokens"],
            "agreement": pre["matches"] / pre["tokens"],
            "expected": pre["expected_sum"] / pre["tokens"],
            "prob": pre["prob_sum"] / pre["tokens"],
        },
        "sources": dict(sorted(sources.items())),
    }  # fmt: skip


def _latest_ratio(names: dict[str, MetricSeries], num: str, den: str, offset: float) -> float | None:
    n, d = names.get(num), names.get(den)
    if n is None or d is None or n.last_step != d.last_step or n.last_value is None or not d.last_value:
        return None
    return offset + n.last_value / d.last_value
