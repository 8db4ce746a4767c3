"""The held-out pass of an EAGLE-3 run: its training-time test over every row, and the same walk as
DFlash's (`draftdeck.drafter.train.walked`) over the chains it drafts.

One TTT pass over a row gives, at every position t, the leading run of correct steps of the chain
drafted there (step k predicts x[t + k + 2]). Decoding drafts that chain after the anchor t + 1 (the
last committed token: the drafter's step 0 at t reads the token x[t + 1] with the target's states at
t), so the walk's run at anchor p is the TTT run at p - 1. On the target's own greedy answers the walk
is real greedy decoding, step for step (tests/unit/drafter/eval/test_eagle3_decoding.py); tau counts
the bonus token, as vLLM does.

Every position's loss, per-step accuracy and expected acceptance are counted (a TTT pass already
computes them all, unlike DFlash's blocks, which the pass samples).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from draftdeck.drafter.kinds.eagle3.model import Eagle3Drafter
from draftdeck.drafter.kinds.eagle3.objective import DEFAULT_DECAY, target_draft_view, ttt_loss
from draftdeck.drafter.model.loss_terms import CE_ONLY, Mix
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.truth import Batch
from draftdeck.drafter.train.walked import known_runs, tally, walk_steps


def runs_at_anchors(runs: torch.Tensor) -> np.ndarray:
    """TTT runs (bsz, T) at t as the walk reads them: at the anchor t + 1 (-1 at position 0)."""
    at = torch.full_like(runs, -1)
    at[:, 1:] = runs[:, :-1]
    return at.cpu().numpy()


@torch.no_grad()
def eagle3_heldout_pass(
    drafter: Eagle3Drafter,
    target: Target,
    batches: Iterable[Batch],
    steps: int,
    *,
    sources: Iterable[Sequence[str]] | None = None,
    judge: bool = True,
    with_loss: bool = True,
    decay: float = DEFAULT_DECAY,
    mix: Mix = CE_ONLY,
) -> tuple[Counts, dict[str, Counts]]:
    """The walked counts over `batches` (slots = steps + 1; the walk's runs are at most `steps`), with
    target agreement when `judge`; with `with_loss`, the loss and per-step counts of every position.
    With `sources` (each batch's row sources), the walk and agreement per source too."""
    was_training = drafter.training
    drafter.eval()
    slots = steps + 1
    total = Counts(slots)
    by_source: dict[str, Counts] = {}
    row_sources = iter(sources) if sources is not None else None
    draft_ids = drafter.t2d.nonzero()[:, 0]
    dtype = next(drafter.parameters()).dtype
    try:
        for batch in batches:
            input_ids, attention_mask, loss_mask = batch
            tf = target.teacher_forced(input_ids, attention_mask, drafter.config.target_layer_ids)
            view = target_draft_view(target.lm_head, tf.last_hidden, draft_ids)
            res = ttt_loss(
                drafter, tf.context.to(dtype), target.embed(input_ids).to(dtype), input_ids, loss_mask,
                attention_mask, steps, teacher=view, mix=mix, decay=decay,
            )  # fmt: skip
            if with_loss:
                total = total + res.counts
            walked = walk_steps(known_runs(runs_at_anchors(res.runs)), loss_mask.cpu().numpy())
            names = list(next(row_sources)) if row_sources is not None else []
            total = total + tally(walked, target, tf, batch, judge, names, slots, by_source)
    finally:
        drafter.train(was_training)
    return total, by_source
