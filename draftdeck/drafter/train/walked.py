"""The walked tau: acceptance measured the way decoding walks, over one teacher-forced pass.

For each assistant span (a maximal run of loss-masked positions g..e) the walk starts at the
first generated position g, as decoding does after prefill produced token g. At anchor p the
block's drafts for p+1..p+B-1 are compared with the actual tokens; accepted = the leading run of
matches, never past e. One verify step is counted with tau = accepted + 1 (incl. bonus, as vLLM
counts it), and the walk jumps to p + 1 + accepted; it stops once p >= e. When the held-out text is
the target's own greedy output, this equals real greedy speculative decoding (DOMAIN.md, Metrics),
while the mean over all anchors of 1 + run (the anchor-mean) is optimistic.

The drafter runs once per eligible anchor (batched, in chunks of anchors); the walk itself is index
chasing over the per-anchor runs (numpy, vectorised over spans).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from draftdeck.drafter.model.attention import Backend
from draftdeck.drafter.model.dflash import DFlashDrafter
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.memory import HELDOUT_ANCHORS_PER_CHUNK
from draftdeck.drafter.train.objective import (
    CE_ONLY,
    Mix,
    all_anchors,
    block_loss,
    build_blocks,
    drafter_hidden,
)
from draftdeck.drafter.train.truth import Batch, agreement_of, target_view


def spans(loss_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the maximal runs of 1 in a (bsz, T) mask, as flat indices into the
    row-major array; ends are inclusive."""
    m = np.asarray(loss_mask, dtype=bool)
    bsz, t = m.shape
    padded = np.zeros((bsz, t + 2), dtype=bool)
    padded[:, 1:-1] = m
    d = np.diff(padded.astype(np.int8), axis=1)
    rs, cs = np.nonzero(d == 1)
    re_, ce = np.nonzero(d == -1)
    return rs * t + cs, re_ * t + ce - 1


def walk(runs: np.ndarray, loss_mask: np.ndarray, block_size: int) -> Counts:
    """Walk every span of `loss_mask` (bsz, T) given `runs` (bsz, T): the leading correct run of
    the block anchored at each position (only read at anchors the walk visits, all of which are
    eligible anchors). Returns counts with the walked fields set."""
    flat = np.asarray(runs, dtype=np.int64).reshape(-1)
    start, end = spans(loss_mask)
    p, e = start.copy(), end
    c = Counts(block_size)
    hist = np.zeros(block_size + 1, dtype=np.int64)
    active = p < e
    while active.any():
        pa, ea = p[active], e[active]
        r = flat[pa]
        if (r < 0).any():
            raise ValueError(f"the walk reached a position with no draft (flat index {int(pa[r < 0][0])})")
        acc = np.minimum(r, ea - pa)
        c.walked_accepted += int(acc.sum())
        c.walked_steps += int(acc.size)
        hist += np.bincount(acc + 1, minlength=block_size + 1)
        p[active] = pa + 1 + acc
        active = p < e
    c.walked_hist = [int(x) for x in hist]
    return c


@torch.no_grad()
def heldout_pass(
    drafter: DFlashDrafter,
    target: Target,
    batches: Iterable[Batch],
    gamma: float,
    *,
    sources: Iterable[Sequence[str]] | None = None,
    judge: bool = True,
    anchors_per_chunk: int = HELDOUT_ANCHORS_PER_CHUNK,
    attention: Backend = "blocked",
    mix: Mix = CE_ONLY,
) -> tuple[Counts, dict[str, Counts]]:
    """Loss, per-slot counts, anchor-mean over EVERY eligible anchor and the walked counts over
    `batches` (on the target's device) and, with `judge`, target agreement on them
    (draftdeck.drafter.train.truth). With `sources` (each batch's row sources), the walk and agreement per
    source too (no loss or per-slot counts there). The loss is the training's (`mix`); the target's
    distribution is known at every slot here, so the expected acceptance per slot is counted too."""
    was_training = drafter.training
    drafter.eval()
    total = Counts(drafter.block_size)
    by_source: dict[str, Counts] = {}
    row_sources = iter(sources) if sources is not None else None
    try:
        for input_ids, attention_mask, loss_mask in batches:
            tf = target.teacher_forced(input_ids, attention_mask, drafter.target_layer_ids)
            context = tf.context.to(next(drafter.parameters()).dtype)
            anchors, valid = all_anchors(loss_mask)
            runs = torch.full(input_ids.shape, -1, dtype=torch.long, device=input_ids.device)
            for i in range(0, anchors.shape[1], anchors_per_chunk):
                a, v = anchors[:, i : i + anchors_per_chunk], valid[:, i : i + anchors_per_chunk]
                batch = build_blocks(
                    input_ids,
                    loss_mask,
                    attention_mask,
                    a,
                    v,
                    drafter.block_size,
                    drafter.mask_token_id,
                    attention,
                )
                hidden = drafter_hidden(drafter, target.embedding, context, batch)
                res = block_loss(target.lm_head, hidden, batch, gamma, teacher=tf.last_hidden, mix=mix)
                total = total + res.counts
                rows = torch.arange(a.shape[0], device=a.device)[:, None].expand_as(a)
                runs[rows[v], a[v]] = res.runs[v]
            view = (
                target_view(target.lm_head, tf.last_hidden, tf.last_logits, input_ids, loss_mask)
                if judge
                else None
            )
            runs_np, mask_np = runs.cpu().numpy(), loss_mask.cpu().numpy()
            w = walk(runs_np, mask_np, drafter.block_size)
            if view is not None:
                w.add_agreement(agreement_of(view, input_ids))
            w.tokens = int(attention_mask.sum()) if attention_mask is not None else input_ids.numel()
            total = total + w
            names = list(next(row_sources)) if row_sources is not None else []
            for name in sorted(set(names)):
                pick = np.asarray([n == name for n in names])
                sub = walk(runs_np[pick], mask_np[pick], drafter.block_size)
                if view is not None:
                    sub.add_agreement(
                        agreement_of(view, input_ids, torch.from_numpy(pick).to(input_ids.device))
                    )
                by_source[name] = by_source[name] + sub if name in by_source else sub
    finally:
        drafter.train(was_training)
    return total, by_source


def heldout_counts(
    drafter: DFlashDrafter,
    target: Target,
    batches: Iterable[Batch],
    gamma: float,
    *,
    judge: bool = True,
    anchors_per_chunk: int = HELDOUT_ANCHORS_PER_CHUNK,
    attention: Backend = "blocked",
) -> Counts:
    """`heldout_pass` over every row together."""
    return heldout_pass(
        drafter, target, batches, gamma, judge=judge, anchors_per_chunk=anchors_per_chunk, attention=attention
    )[0]
