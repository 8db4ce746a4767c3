"""The eval's two checks of real decoding against what it can be compared with.

- `decoder_mismatch`: against the walk over the outputs decoding produced. The same computation done
  twice, so equal whatever the drafter was trained on: apart, the decoder or the estimator is broken.
- `versus_training`: against the run's held-out taus for the same checkpoint (its index entry),
  judged by the target (the walk over the target's own answers to held-out prompts) and judged by
  the data. On the prompts the run's target answered when the eval decoded them (an eval of the
  run's held-out split; run.json names them), else on all of the eval's prompts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftdeck.drafter.train.checkpoint import CheckpointStore
from draftdeck.drafter.train.truth import OFF_TARGET

ESTIMATE_OFF = "training_estimate_off"


def decoder_mismatch(real_tau: float, walked_tau: float, tolerance: float) -> tuple[float, str | None]:
    """(relative gap, the alert message when the gap is above `tolerance`, else None)."""
    if not (math.isfinite(real_tau) and math.isfinite(walked_tau)) or real_tau <= 0:
        return float("nan"), None
    gap = abs(real_tau - walked_tau) / real_tau
    if gap <= tolerance:
        return gap, None
    return gap, (
        f"real greedy tau {real_tau:.3f} incl. bonus vs walked tau {walked_tau:.3f} incl. bonus over the "
        f"same outputs: {gap:.1%} apart, above {tolerance:.0%}. Decoding and the walked estimate should "
        "agree exactly here: one of them is broken"
    )


@dataclass(frozen=True)
class RunFigures:
    """What a checkpoint's run says of it: its index entry and the held-out rows (dataset folder,
    row) whose prompts the run's target answered (run.json; empty when unknown)."""

    entry: dict[str, Any]
    answered: frozenset[tuple[str, int]] = frozenset()


def run_figures(checkpoint: Path) -> RunFigures | None:
    """The figures of the run the checkpoint `checkpoint` names belongs to: a checkpoint folder of a
    run, or a run folder (its best checkpoint); None for anything else (an export)."""
    path = Path(checkpoint)
    run = path.parent if path.name == "checkpoints" else path
    entry = None
    if (run / "checkpoints" / "index.json").is_file():
        idx = CheckpointStore(run).index()
        entry = next((c for c in idx.checkpoints if c["step"] == idx.best), None)
    elif path.parent.name == "checkpoints" and (path.parent / "index.json").is_file():
        run = path.parent.parent
        entry = next((c for c in CheckpointStore(run).index().checkpoints if c["path"] == path.name), None)
    if entry is None:
        return None
    try:
        truth = json.loads((run / "run.json").read_text(encoding="utf-8")).get("truth") or {}
    except (OSError, ValueError):
        truth = {}
    rows = truth.get("target_answered_rows") or []
    return RunFigures(entry, frozenset((str(f), int(r)) for f, r in rows))


@dataclass(frozen=True)
class Real:
    """Real greedy tau incl. bonus over every prompt, and over the prompts the run's target answered
    (`same_prompts` 0: none of them was decoded)."""

    tau: float
    prompts: int
    same_tau: float = float("nan")
    same_prompts: int = 0


def versus_training(
    real: Real, run: RunFigures | None, tolerance: float, off_target_tolerance: float
) -> tuple[dict[str, Any] | None, tuple[str, str] | None]:
    """(the figures for eval.json, (alert kind, message) or None).

    - target-judged more than `tolerance` from real: `training_estimate_off` (the figure that should
      hold is wrong: another block size, target or answer length than the run's, or a bug);
    - data-judged above real by more than `off_target_tolerance`: `data_not_target_output` (the
      drafter learnt the data's writer, not the target: the live tau judged by the data overstated real
      decoding). Looser than `tolerance`: on the target's own answers the data-judged tau runs up to
      ~5 % above real, as tokenize re-tokenizes their text (docs/train.md). Data-judged *below* real is
      what the target's own sampled answers give: no alert."""
    if run is None or not math.isfinite(real.tau) or real.tau <= 0:
        return None, None
    entry = run.entry
    same = real.same_prompts > 0

    def tau(kind: str) -> float | None:
        steps = entry.get(f"{kind}_steps")
        return 1 + float(entry[f"{kind}_accepted"]) / steps if steps else None

    ref = real.same_tau if same else real.tau
    judged = tau("heldout_target_walked")
    data = (tau("heldout_matched_walked") if same else None) or tau("heldout_walked")
    figures = {
        "checkpoint_step": entry.get("step"),
        "real_tau_incl_bonus": ref,
        "real_over": f"the {real.same_prompts} held-out prompts the run's target answered" if same
        else f"all {real.prompts} prompts",
        "data_judged_tau_incl_bonus": data,
        "target_judged_tau_incl_bonus": judged,
        "data_judged_gap": None if data is None else (data - ref) / ref,
        "target_judged_gap": None if judged is None else (judged - ref) / ref,
        "tolerance": tolerance,
        "off_target_tolerance": off_target_tolerance,
    }  # fmt: skip
    named = (
        f"real tau {ref:.3f} ({figures['real_over']}), the run's held-out tau at step {entry.get('step')} "
        f"judged by the data {_fmt(data)} and judged by the target (its own answers) {_fmt(judged)}, all "
        "incl. bonus"
    )
    if judged is not None and abs(judged - ref) / ref > tolerance:
        why = (
            f"{named}: the target-judged estimate is {(judged - ref) / ref:+.1%} off real decoding "
            f"(tolerance {tolerance:.0%}): another block size, target or answer length than the run's, "
            "or a bug"
        )
        return figures, (ESTIMATE_OFF, why)
    if data is not None and (data - ref) / ref > off_target_tolerance:
        why = (
            f"{named}: the data-judged tau is {(data - ref) / ref:+.1%} above real decoding "
            f"(off_target_tolerance {off_target_tolerance:.0%}): the drafter learnt the data's writer, not "
            "the target. Regenerate the training answers with this target"
        )
        return figures, (OFF_TARGET, why)
    return figures, None


def _fmt(tau: float | None) -> str:
    return "-" if tau is None else f"{tau:.3f}"
