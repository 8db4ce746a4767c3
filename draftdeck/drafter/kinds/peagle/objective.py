"""P-EAGLE's training objective over the chains a step computes, and its counts.

The element at anchor t of depth d (`model.depth_labels`) predicts x[t + d + 2]; it is scored as
EAGLE-3's TTT step d is (`draftdeck.drafter.kinds.eagle3.objective`): the CE of the label's draft id,
the KL from the target's next-token distribution at t + d + 1 over the draft vocabulary, and the mix's
other terms, by their weights. Every kept element weighs 1, as in speculators' P-EAGLE: COD sampling
already keeps fewer chains the deeper the depth; the sum is divided by the given normaliser (the global
count of trained elements).

Counts: depth d is slot d + 1. The anchor runs (the leading correct depths from t: what a verify step
drafting at t gets accepted) are counted only when every chain is computed at every depth (the held-out
pass): COD's chains stop at random depths, and a run cut short by sampling is no acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from draftdeck.drafter.kinds.eagle3.objective import TargetDraftView, draft_index
from draftdeck.drafter.kinds.peagle.model import PEagleDrafter, depth_labels
from draftdeck.drafter.model.loss_terms import CE_ONLY, Mix, as_mix, term_value
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.losses import leading_runs


@dataclass
class PEagleResult:
    """`loss` (a scalar with grad), `counts` (slot d + 1 = depth d), `runs` (bsz, T) the leading correct
    depths from each anchor (-1 where depth 0 is not counted), None unless every chain was computed."""

    loss: torch.Tensor
    counts: Counts
    runs: torch.Tensor | None


def gather_rows(x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """x[b, at[b, i]] for x (bsz, T, N) and at (bsz, n): (bsz, n, N)."""
    return x.gather(1, at[..., None].expand(-1, -1, x.shape[-1]))


def peagle_loss(
    drafter: PEagleDrafter,
    aux: torch.Tensor,
    embeds: torch.Tensor,
    mask_embed: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None,
    anchors: list[torch.Tensor],
    *,
    depths: int,
    teacher: TargetDraftView | None = None,
    mix: Mix | tuple[float, float] = CE_ONLY,
    normalizer: float | None = None,
) -> PEagleResult:
    """The objective over one batch (module doc): `anchors` each depth's chains (`cod.kept_anchors`, or
    `model.dense_anchors` for every chain), `depths` the slots counted (K), `teacher` the target's view
    (needed by a KL part and by the expected acceptances)."""
    mix = as_mix(mix)
    if mix.needs_teacher and teacher is None:
        raise ValueError("a KL loss needs the target's view (teacher)")
    bsz, t = input_ids.shape
    hidden = drafter.parallel(aux, embeds, mask_embed, anchors, attention_mask)
    to_draft = draft_index(drafter.t2d)
    c = Counts(depths + 1)
    dense = len(anchors) == depths and all(a.shape[1] == t for a in anchors)
    grid = torch.zeros((bsz, depths, t), dtype=torch.bool, device=input_ids.device)
    total = hidden[0].new_zeros((), dtype=torch.float32)
    wsum = 0
    for d, (h, pos) in enumerate(zip(hidden, anchors, strict=True)):
        labels, sel = depth_labels(input_ids, loss_mask, pos, d, pos < t)
        logq = F.log_softmax(drafter.logits(h).float(), dim=-1)  # (bsz, n, N)
        correct = sel & (drafter.target_ids(logq.argmax(-1)) == labels)
        if dense:  # every anchor, in order
            grid[:, d] = correct
        per = logq.new_zeros(sel.shape)
        if mix.ce:
            label_draft = to_draft[labels]
            ce = -logq.gather(-1, label_draft.clamp(min=0)[..., None])[..., 0]
            per = per + mix.ce * torch.where(sel & (label_draft >= 0), ce, 0.0)
        if teacher is not None:
            at = (pos + d + 1).clamp(max=t - 1)
            logp, p = gather_rows(teacher.logp, at), gather_rows(teacher.p, at)
            if mix.kl:
                per = per + mix.kl * (logp.exp() * (logp - logq)).sum(-1)
            for name, weight in mix.others:
                per = per + weight * term_value(name, logp, logq, mix.lk_eta)
            with torch.no_grad():
                c.accept_sum[d + 1] = float(torch.minimum(p, logq.exp()).sum(-1)[sel].sum())
                c.draft_prob_sum[d + 1] = float(
                    p.gather(-1, logq.argmax(-1, keepdim=True))[..., 0][sel].sum()
                )
                c.accept_total[d + 1] = int(sel.sum())
        total = total + per[sel].sum()
        c.correct[d + 1], c.total[d + 1] = int(correct.sum()), int(sel.sum())
        c.loss_sum += float(per[sel].detach().sum())
        wsum += int(sel.sum())
    c.weight_sum = float(wsum)
    runs = None
    if dense:
        starts = depth_labels(input_ids, loss_mask, anchors[0], 0, anchors[0] < t)[1]
        # leading_runs reads slots 1.. of (bsz, A, B): here A = T anchors, B = depths + 1
        slots = torch.cat([torch.zeros_like(grid[:, :1]), grid], dim=1).transpose(1, 2)
        runs = leading_runs(slots, starts)
        kept = runs[starts]
        c.anchor_accepted, c.anchor_blocks = int(kept.sum()), int(kept.numel())
        c.anchor_hist = [int(x) for x in torch.bincount(kept + 1, minlength=depths + 2).tolist()]
    denom = normalizer if normalizer is not None else max(float(wsum), 1e-12)
    return PEagleResult(total / denom, c, runs)
