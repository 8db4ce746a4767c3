"""EAGLE-3's training objective (training-time test over the draft vocabulary) and its counts.

Step k at position t (`draftdeck.drafter.kinds.eagle3.model.ttt_labels`) predicts x[t + k + 2], counted
where the shifted loss mask is 1. The drafter's distribution q over its N draft ids is scored
against:

- the data (`ce`): the cross-entropy of the label's draft id. A label outside the draft vocabulary
  cannot be drafted: it adds no CE and counts as a miss;
- the target (`kl`): the forward KL from p, the target's next-token distribution at t + k + 1 (its
  head on its final hidden state there) restricted to the draft vocabulary and renormalised: EAGLE's
  and SpecForge's soft labels, speculators' KL;

and the mix's other terms (`draftdeck.drafter.train.losses`: rkl, jsd, tv, nla, lk_hybrid, against
the same p, in torch ops over the draft vocabulary), mixed by their weights, weighted w_k = decay^k
(0.8 in EAGLE and SpecForge) and divided by the given normaliser (the global sum of w over counted
positions, as DFlash's objective).

Counts use DFlash's slots so that every chart, alert and walk reads them alike: step k is slot
k + 1 of a `Counts(steps + 1)`; the anchor runs are the leading correct steps from t (what a chain
of `steps` drafts at t gets accepted, judged by the data); the expected acceptances use the target's
whole distribution (q is 0 outside the draft vocabulary, where min(p, q) is 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from draftdeck.drafter.kinds.eagle3.model import Eagle3Drafter, ahead, ttt_labels
from draftdeck.drafter.model.head import LOGITS_CHUNK_BYTES, rows_per_chunk
from draftdeck.drafter.model.loss_terms import CE_ONLY, Mix, as_mix, term_value
from draftdeck.drafter.model.vocab_parallel import ShardedHead
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.losses import leading_runs

DEFAULT_DECAY = 0.8


@dataclass
class TargetDraftView:
    """The target's next-token view at every position (bsz, T, ...), over the draft vocabulary:
    `logp` its log-distribution restricted to the draft ids and renormalised, `p` its whole
    distribution's mass at each draft id, `greedy` its argmax over the whole vocabulary."""

    logp: torch.Tensor
    p: torch.Tensor
    greedy: torch.Tensor


@torch.no_grad()
def target_draft_view(
    head: nn.Module, last_hidden: torch.Tensor, draft_ids: torch.Tensor, chunk_bytes: int = LOGITS_CHUNK_BYTES
) -> TargetDraftView:
    """`TargetDraftView` of the target's final hidden states (bsz, T, H), a chunk of whole-vocabulary
    logits at a time (`chunk_bytes` of float32 logits)."""
    bsz, t, h = last_hidden.shape
    flat = last_hidden.reshape(-1, h)
    n = draft_ids.shape[0]
    logp = torch.empty(flat.shape[0], n, dtype=torch.float32, device=flat.device)
    p = torch.empty_like(logp)
    greedy = torch.empty(flat.shape[0], dtype=torch.long, device=flat.device)
    rows = rows_per_chunk(int(getattr(head, "out_features", 0)) or 1, chunk_bytes)
    chunks = math.ceil(flat.shape[0] / rows)
    if isinstance(head, ShardedHead):  # each call a collective: every rank makes as many (some empty)
        chunks = head.shard.calls(chunks, flat.device)
    for s in range(0, chunks * rows, rows):
        logits = head(flat[s : s + rows]).float()
        greedy[s : s + rows] = logits.argmax(-1)
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        mine = logits[:, draft_ids]
        p[s : s + rows] = (mine - lse).exp()
        logp[s : s + rows] = F.log_softmax(mine, dim=-1)
    return TargetDraftView(logp.view(bsz, t, n), p.view(bsz, t, n), greedy.view(bsz, t))


def draft_index(t2d: torch.Tensor) -> torch.Tensor:
    """(V,) each target id's draft id, -1 where it has none."""
    return torch.where(t2d, torch.cumsum(t2d.long(), 0) - 1, torch.full_like(t2d, -1, dtype=torch.long))


@dataclass
class TTTResult:
    """`loss` (a scalar with grad), `counts` (slot k + 1 = step k), `runs` (bsz, T) the leading
    correct steps from each position (-1 where step 0 is not counted)."""

    loss: torch.Tensor
    counts: Counts
    runs: torch.Tensor


def ttt_loss(
    drafter: Eagle3Drafter,
    aux: torch.Tensor,
    embeds: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None,
    steps: int,
    *,
    teacher: TargetDraftView | None = None,
    mix: Mix | tuple[float, float] = CE_ONLY,
    decay: float = DEFAULT_DECAY,
    normalizer: float | None = None,
) -> TTTResult:
    """The objective over one batch (module doc): `aux` the tapped target states, `embeds` the
    target's embedding of `input_ids`, `teacher` the target's view (needed by a KL part and by the
    expected acceptances)."""
    mix = as_mix(mix)
    ce_w, kl_w = mix.ce, mix.kl
    if mix.needs_teacher and teacher is None:
        raise ValueError("a KL loss needs the target's view (teacher)")
    hidden = drafter.ttt(aux, embeds, steps, attention_mask)
    labels, counted = ttt_labels(input_ids, loss_mask, steps)
    to_draft = draft_index(drafter.t2d)
    c = Counts(steps + 1)
    correct = torch.zeros_like(counted)
    total = hidden[0].new_zeros((), dtype=torch.float32)
    wsum = 0.0
    for k, h in enumerate(hidden):
        sel = counted[:, k]
        w = decay**k
        logq = F.log_softmax(drafter.logits(h).float(), dim=-1)  # (bsz, T, N)
        label_draft = to_draft[labels[:, k]]
        drafted = drafter.target_ids(logq.argmax(-1))
        correct[:, k] = sel & (drafted == labels[:, k])
        per = logq.new_zeros(sel.shape)
        if ce_w:
            known = sel & (label_draft >= 0)
            ce = -logq.gather(-1, label_draft.clamp(min=0)[..., None])[..., 0]
            per = per + ce_w * torch.where(known, ce, 0.0)
        if teacher is not None:
            logp, p = ahead(teacher.logp, k + 1), ahead(teacher.p, k + 1)
            if kl_w:
                per = per + kl_w * (logp.exp() * (logp - logq)).sum(-1)
            for name, weight in mix.others:
                per = per + weight * term_value(name, logp, logq, mix.lk_eta)
            with torch.no_grad():
                q = logq.exp()
                c.accept_sum[k + 1] = float(torch.minimum(p, q).sum(-1)[sel].sum())
                c.draft_prob_sum[k + 1] = float(
                    p.gather(-1, logq.argmax(-1, keepdim=True))[..., 0][sel].sum()
                )
                c.accept_total[k + 1] = int(sel.sum())
        total = total + w * per[sel].sum()
        c.correct[k + 1], c.total[k + 1] = int(correct[:, k].sum()), int(sel.sum())
        c.loss_sum += float(w * per[sel].detach().sum())
        wsum += w * int(sel.sum())
    c.weight_sum = wsum
    starts = counted[:, 0]
    # leading_runs reads slots 1.. of (bsz, A, B): here A = T positions, B = steps + 1
    slots = torch.cat([torch.zeros_like(correct[:, :1]), correct], dim=1).transpose(1, 2)
    runs = leading_runs(slots, starts)
    kept = runs[starts]
    c.anchor_accepted, c.anchor_blocks = int(kept.sum()), int(kept.numel())
    c.anchor_hist = [int(x) for x in torch.bincount(kept + 1, minlength=steps + 2).tolist()]
    denom = normalizer if normalizer is not None else max(wsum, 1e-12)
    return TTTResult(total / denom, c, runs)
