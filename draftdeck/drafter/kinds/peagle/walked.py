"""The held-out pass of a P-EAGLE run: every chain at every depth (no COD sampling), and the same walk
as EAGLE-3's over the chains it drafts (`draftdeck.drafter.kinds.eagle3.walked`: the run at anchor t is
the chain drafted from the pair at t - 1, which is what `PEagleSource` proposes after committing t)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from draftdeck.drafter.kinds.eagle3.objective import target_draft_view
from draftdeck.drafter.kinds.eagle3.walked import runs_at_anchors
from draftdeck.drafter.kinds.peagle.model import PEagleDrafter, dense_anchors
from draftdeck.drafter.kinds.peagle.objective import peagle_loss
from draftdeck.drafter.model.loss_terms import CE_ONLY, Mix
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.truth import Batch
from draftdeck.drafter.train.walked import known_runs, tally, walk_steps


def mask_embedding(drafter: PEagleDrafter, target: Target, dtype: torch.dtype) -> torch.Tensor:
    """The mask token's embedding (H,): the target's row, as the servers embed it."""
    device = next(drafter.parameters()).device
    ids = torch.tensor([[drafter.config.mask_token_id]], device=device)
    return target.embed(ids)[0, 0].to(dtype)


@torch.no_grad()
def peagle_heldout_pass(
    drafter: PEagleDrafter,
    target: Target,
    batches: Iterable[Batch],
    depths: int,
    *,
    sources: Iterable[Sequence[str]] | None = None,
    judge: bool = True,
    with_loss: bool = True,
    mix: Mix = CE_ONLY,
) -> tuple[Counts, dict[str, Counts]]:
    """The walked counts over `batches` (slots = depths + 1), with target agreement when `judge`; with
    `with_loss`, the loss and per-depth counts of every chain. With `sources` (each batch's row
    sources), the walk and agreement per source too."""
    was_training = drafter.training
    drafter.eval()
    slots = depths + 1
    total = Counts(slots)
    by_source: dict[str, Counts] = {}
    row_sources = iter(sources) if sources is not None else None
    draft_ids = drafter.t2d.nonzero()[:, 0]
    dtype = next(drafter.parameters()).dtype
    mask_embed = mask_embedding(drafter, target, dtype)
    try:
        for batch in batches:
            input_ids, attention_mask, loss_mask = batch
            tf = target.teacher_forced(input_ids, attention_mask, drafter.config.target_layer_ids)
            view = target_draft_view(target.lm_head, tf.last_hidden, draft_ids)
            anchors = dense_anchors(input_ids.shape[0], input_ids.shape[1], depths, input_ids.device)
            res = peagle_loss(
                drafter, tf.context.to(dtype), target.embed(input_ids).to(dtype), mask_embed, input_ids,
                loss_mask, attention_mask, anchors, depths=depths, teacher=view, mix=mix,
            )  # fmt: skip
            if with_loss:
                total = total + res.counts
            assert res.runs is not None  # every chain computed
            walked = walk_steps(known_runs(runs_at_anchors(res.runs)), loss_mask.cpu().numpy())
            names = list(next(row_sources)) if row_sources is not None else []
            total = total + tally(walked, target, tf, batch, judge, names, slots, by_source)
    finally:
        drafter.train(was_training)
    return total, by_source
