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

from collections.abc import Iterable

import numpy as np
import torch

from draftdeck.drafter.counts import Counts
from draftdeck.drafter.model import DFlashDrafter
from draftdeck.drafter.objective import all_anchors, block_loss, build_blocks, drafter_hidden
from draftdeck.drafter.target import Target


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
def heldout_counts(
    drafter: DFlashDrafter,
    target: Target,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    gamma: float,
    *,
    anchors_per_chunk: int = 256,
) -> Counts:
    """Loss, per-slot counts, anchor-mean over EVERY eligible anchor, and the walked counts, over
    `batches` of (input_ids, attention_mask, loss_mask) on the target's device."""
    was_training = drafter.training
    drafter.eval()
    total = Counts(drafter.block_size)
    try:
        for input_ids, attention_mask, loss_mask in batches:
            _, context = target.context_features(input_ids, attention_mask, drafter.target_layer_ids)
            context = context.to(next(drafter.parameters()).dtype)
            anchors, valid = all_anchors(loss_mask)
            runs = torch.full(input_ids.shape, -1, dtype=torch.long, device=input_ids.device)
            for i in range(0, anchors.shape[1], anchors_per_chunk):
                a, v = anchors[:, i : i + anchors_per_chunk], valid[:, i : i + anchors_per_chunk]
                batch = build_blocks(
                    input_ids, loss_mask, attention_mask, a, v, drafter.block_size, drafter.mask_token_id
                )
                hidden = drafter_hidden(drafter, target.embedding, context, batch)
                res = block_loss(target.lm_head, hidden, batch, gamma)
                total = total + res.counts
                rows = torch.arange(a.shape[0], device=a.device)[:, None].expand_as(a)
                runs[rows[v], a[v]] = res.runs[v]
            w = walk(runs.cpu().numpy(), loss_mask.cpu().numpy(), drafter.block_size)
            w.tokens = int(attention_mask.sum()) if attention_mask is not None else input_ids.numel()
            total = total + w
    finally:
        drafter.train(was_training)
    return total
