"""The compare view's side-by-side table: runs of any drafter kinds on the same axes,
each figure labelled with its convention. Every τ counts the bonus token, as vLLM does; the training
estimates (walked τ) sit beside real speculative decoding, never instead of it."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from app.store.models import MetricSeries
from draftdeck.drafter.kinds import NAMES, DrafterKind, get_kind

MAX_POSITIONS = 8  # per-position acceptance shown for the first drafts; the charts have them all


def _latest(names: dict[str, MetricSeries], num: str, den: str, offset: float = 0.0) -> float | None:
    a, b = names.get(num), names.get(den)
    if a is None or b is None or a.last_step != b.last_step or a.last_value is None or not b.last_value:
        return None
    return offset + a.last_value / b.last_value


def drafter_kind(params: dict[str, Any]) -> DrafterKind:
    """The drafter kind a train job trains (a job from before kinds were named trained DFlash)."""
    name = params.get("drafter")
    return get_kind(name if isinstance(name, str) and name in NAMES else "dflash")


def drafter_label(params: dict[str, Any]) -> str:
    """The drafter a train job trains, from its parameters (run.json's `drafter` is its config)."""
    kind = drafter_kind(params)
    return kind.drafting(kind.slots(params))


def vocabulary_note(run: dict[str, Any]) -> str | None:
    """What an EAGLE-3 run drafts over, from run.json's `drafter`: its draft ids, the share of the
    training split's trained tokens they cover (a ceiling on acceptance), and where the mapping came
    from; None for a run without one (DFlash drafts over the target's whole vocabulary)."""
    d = run.get("drafter")
    if not isinstance(d, dict) or d.get("kind") != "eagle3" or d.get("draft_vocab_size") is None:
        return None
    note = f"{int(d['draft_vocab_size']):,} draft ids"
    if isinstance(d.get("draft_vocab_coverage"), int | float):
        note += f", {100 * d['draft_vocab_coverage']:.1f} % of trained tokens"
    source = d.get("draft_vocab_from")  # a file's path; None: counted over the training split
    return note + (f", from {PurePath(source).name}" if isinstance(source, str) else "")


def _positions(names: dict[str, MetricSeries]) -> list[float | None]:
    out = []
    for k in range(1, MAX_POSITIONS + 1):
        if f"heldout/pos/{k}/total" not in names:
            break
        out.append(_latest(names, f"heldout/pos/{k}/correct", f"heldout/pos/{k}/total"))
    return out


def _wall_seconds(view: dict[str, Any]) -> float | None:
    job = view["job"]
    if job.started_at is None:
        return None
    walls = [s.last_wall_ms for s in view["names"].values() if s.last_wall_ms]
    end = (
        job.finished_at.timestamp() if job.finished_at is not None else (max(walls) / 1000 if walls else None)
    )
    return None if end is None else max(0.0, end - job.started_at.timestamp())


def _eval(view: dict[str, Any]) -> dict[str, Any] | None:
    """The latest eval with a real figure (the run page's evals are in checkpoint order)."""
    return next((e for e in reversed(view["evals"]) if e["real_all"] is not None), None)


def side_by_side(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One column per run: what it is, what the training estimates, what real decoding measured, what
    it cost. Each value None where not measured (shown as a dash)."""
    cols = []
    for v in views:
        names, ev = v["names"], _eval(v)
        steps = names.get("train/loss")
        tokens = max((s.last_tokens or 0 for s in names.values()), default=0)
        peak = names.get("train/peak_memory_mib")
        cols.append(
            {
                "job": v["job"],
                "drafter": drafter_label(v["job"].params),
                "vocabulary": vocabulary_note(v["params"]) or "the target's whole vocabulary",
                "tau_target": _latest(
                    names, "heldout/target_walked/accepted", "heldout/target_walked/steps", 1.0
                ),
                "tau_data": _latest(names, "heldout/walked/accepted", "heldout/walked/steps", 1.0),
                "positions": _positions(names),
                "real": None if ev is None else ev["real_all"],
                "tokens_per_step": None if ev is None else ev["tokens_per_step"],
                "speedup": None if ev is None else ev["speedup"],
                "eval_job": None if ev is None else ev["job"].id,
                "steps": None if steps is None else steps.last_step,
                "tokens": tokens or None,
                "seconds": _wall_seconds(v),
                "peak_mib": None if peak is None else peak.max_value,
            }
        )
    return cols
