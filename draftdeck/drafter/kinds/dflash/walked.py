"""DFlash's held-out pass: the walked tau (draftdeck.drafter.train.walked) over its blocks, the loss,
per-slot counts and expected acceptance.

For each assistant span (a maximal run of loss-masked positions g..e) the walk starts at the
first generated position g, as decoding does after prefill produced token g. At anchor p the
block's drafts for p+1..p+B-1 are compared with the actual tokens; accepted = the leading run of
matches, never past e. One verify step is counted with tau = accepted + 1 (incl. bonus, as vLLM
counts it), and the walk jumps to p + 1 + accepted; it stops once p >= e. When the held-out text is
the target's own greedy output, this equals real greedy speculative decoding (DOMAIN.md, Metrics),
while the mean over all anchors of 1 + run (the anchor-mean) is optimistic.

The target's head (a 248K vocabulary: the pass's cost) reads what the walk needs, in two phases per
batch, against the drafter's context keys and values computed once:

1. `first_slots`: a block at every eligible anchor, in chunks; every slot through the head at a
   seeded sample of anchors per row (the loss, per-slot accuracy, expected acceptance and
   anchor-mean: the figures that need every slot's distribution; the sample drawn as training draws
   its anchors, from a generator seeded by the run's seed and the row's tokens, so the same anchors
   at every pass, on any number of ranks), elsewhere slot 1 alone: where it is wrong the run is 0.
2. `walk_steps` over `Drafts`: the walk, every span of every row a step at a time; where it reaches
   an anchor whose slot 1 was right, the block is drafted again and all its slots read, one head
   call per step for all the spans that need one.

A pass reads about T + (B - 1) x (the walk's steps that accepted a draft) head rows per row, where
drafting every slot at every anchor read (B - 1) x T; the walk is the same, step for step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from draftdeck.drafter.kinds.dflash.memory import HELDOUT_ANCHORS_PER_CHUNK
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.objective import (
    ContextKV,
    all_anchors,
    block_loss,
    build_blocks,
    drafter_hidden,
    sample_anchors_per_row,
)
from draftdeck.drafter.model.attention import Backend
from draftdeck.drafter.model.loss_terms import CE_ONLY, Mix
from draftdeck.drafter.model.target import Target, TargetPass
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.truth import Batch
from draftdeck.drafter.train.walked import drafted_runs, row_generators, tally, walk_steps


def leading_runs_read(
    drafter: DFlashDrafter,
    head: nn.Module,
    hidden: torch.Tensor,
    previous: torch.Tensor,
    labels: torch.Tensor,
    counted: torch.Tensor,
) -> torch.Tensor:
    """(m,) each block's leading run of drafts equal to `labels` from slot 1 (an uncounted slot ends
    it): every counted slot of `hidden` (m, slots, H) drafted at once, its previous token the data's
    (while the run lasts, the one decoding drafted)."""
    correct = torch.zeros_like(counted)
    features = drafter.block_features(hidden, previous)
    chosen = drafter.slot_choice(
        head, hidden[counted], previous[counted], None if features is None else features[counted]
    )
    correct[counted] = chosen == labels[counted]
    return correct[:, 1:].long().cumprod(dim=1).sum(dim=1)


def _sample(batch: Batch, anchors: torch.Tensor, per_row: int | None, seed: int) -> torch.Tensor:
    """(bsz, A) bool: which of `anchors` (every eligible one, ascending) are in the row's seeded
    sample of `per_row` (None: all of them)."""
    input_ids, attention_mask, loss_mask = batch
    if per_row is None:
        return torch.ones_like(anchors, dtype=torch.bool)
    bsz, t = input_ids.shape
    lengths = [int(n) for n in attention_mask.sum(1)] if attention_mask is not None else [t] * bsz
    picked = torch.zeros(bsz, t + 1, dtype=torch.bool, device=anchors.device)
    if per_row > 0:
        pos, ok = sample_anchors_per_row(
            loss_mask, lengths, per_row, row_generators(input_ids, lengths, seed)
        )
        picked[torch.arange(bsz, device=pos.device)[:, None].expand_as(pos)[ok], pos[ok]] = True
    return picked.gather(1, anchors)


UNKNOWN = -2  # `first_slots`: slot 1 was right, the run is not known yet


def first_slots(
    drafter: DFlashDrafter,
    target: Target,
    batch: Batch,
    context: tuple[torch.Tensor, ContextKV],
    tf: TargetPass,
    gamma: float,
    *,
    per_row: int | None,
    seed: int,
    mix: Mix,
    attention: Backend,
    anchors_per_chunk: int,
) -> tuple[torch.Tensor, Counts]:
    """Phase 1 of the pass (module doc): a block at every eligible anchor of `batch`; every slot
    through the head at a seeded sample of `per_row` anchors per row (None: all), slot 1 alone
    elsewhere. Returns (runs (bsz, T): exact at the sample and where slot 1 was wrong, `UNKNOWN`
    where it was right, -1 at no anchor; the sample's counts)."""
    input_ids, attention_mask, loss_mask = batch
    hidden_states, kv = context
    bsz = input_ids.shape[0]
    anchors, valid = all_anchors(loss_mask)
    sampled = _sample(batch, anchors, per_row, seed) & valid
    runs = torch.full(input_ids.shape, -1, dtype=torch.long, device=input_ids.device)
    counts = Counts(drafter.slots)
    rows = torch.arange(bsz, device=input_ids.device)[:, None]
    for i in range(0, anchors.shape[1], anchors_per_chunk):
        part = slice(i, i + anchors_per_chunk)
        a, v, s = anchors[:, part], valid[:, part], sampled[:, part]
        blocks = build_blocks(
            input_ids, loss_mask, attention_mask, a, v, drafter.block_size, drafter.mask_token_id, attention,
            drafter.shift,
        )  # fmt: skip
        hidden = drafter_hidden(drafter, target.embedding, hidden_states, blocks, kv)
        if s.any():
            only = replace(blocks, valid=s, label_valid=blocks.label_valid & s[:, :, None])
            res = block_loss(
                target.lm_head, hidden, only, gamma, teacher=tf.last_hidden, mix=mix, drafter=drafter
            )
            counts = counts + res.counts
            runs[rows.expand_as(a)[s], a[s]] = res.runs[s]
        rest = v & ~s  # an eligible anchor's slot 1 is always counted
        if rest.any():
            previous = blocks.previous()[rest]
            features = drafter.block_features(hidden[rest], previous)
            first = drafter.slot_choice(
                target.lm_head,
                hidden[rest][:, 1],
                previous[:, 1],
                None if features is None else features[:, 1],
            )
            right = first == blocks.labels[rest][:, 1]
            runs[rows.expand_as(a)[rest], a[rest]] = torch.where(right, UNKNOWN, 0)
    return runs, counts


class Drafts:
    """Phase 2's `runs_at` over one batch (module doc): the runs `first_slots` knows; where slot 1 was
    right, the blocks at those positions drafted again (batched across rows) and all their slots read."""

    def __init__(
        self,
        drafter: DFlashDrafter,
        target: Target,
        batch: Batch,
        context: tuple[torch.Tensor, ContextKV],
        runs: torch.Tensor,
        attention: Backend,
    ):  # fmt: skip
        self.drafter, self.target, self.batch, self.context, self.attention = (
            drafter, target, batch, context, attention,
        )  # fmt: skip
        self.runs = runs.cpu().numpy().reshape(-1)
        self.drafted = 0  # blocks drafted again

    def __call__(self, flat: np.ndarray) -> np.ndarray:
        r = self.runs[flat]
        todo = np.nonzero(r == UNKNOWN)[0]
        if todo.size:
            r[todo] = self._draft(flat[todo])
            self.runs[flat[todo]] = r[todo]
        return drafted_runs(r, flat)

    def _draft(self, flat: np.ndarray) -> np.ndarray:
        input_ids, attention_mask, loss_mask = self.batch
        bsz, t = input_ids.shape
        order = np.argsort(flat, kind="stable")
        rows, cols = flat[order] // t, flat[order] % t
        per_row = np.bincount(rows, minlength=bsz)
        slot = np.arange(rows.size) - (np.cumsum(per_row) - per_row)[rows]
        dev = input_ids.device
        r, s = torch.from_numpy(rows).to(dev), torch.from_numpy(slot).to(dev)
        anchors = torch.zeros(bsz, int(per_row.max()), dtype=torch.long, device=dev)
        valid = torch.zeros_like(anchors, dtype=torch.bool)
        anchors[r, s], valid[r, s] = torch.from_numpy(cols).to(dev), True
        d = self.drafter
        blocks = build_blocks(
            input_ids, loss_mask, attention_mask, anchors, valid, d.block_size, d.mask_token_id,
            self.attention, d.shift,
        )  # fmt: skip
        hidden = drafter_hidden(d, self.target.embedding, self.context[0], blocks, self.context[1])
        runs = leading_runs_read(
            d, self.target.lm_head, hidden[r, s], blocks.previous()[r, s], blocks.labels[r, s],
            blocks.label_valid[r, s],
        )  # fmt: skip
        self.drafted += int(flat.size)
        out = np.empty(flat.size, dtype=np.int64)
        out[order] = runs.cpu().numpy()
        return out


@torch.no_grad()
def heldout_pass(
    drafter: DFlashDrafter,
    target: Target,
    batches: Iterable[Batch],
    gamma: float,
    *,
    sources: Iterable[Sequence[str]] | None = None,
    judge: bool = True,
    anchors_per_row: int | None = 0,
    seed: int = 0,
    anchors_per_chunk: int = HELDOUT_ANCHORS_PER_CHUNK,
    attention: Backend = "blocked",
    mix: Mix = CE_ONLY,
) -> tuple[Counts, dict[str, Counts]]:
    """The walked counts over `batches` (on the target's device); the loss (the training's, `mix`),
    per-slot counts, expected acceptance and anchor-mean at a seeded sample of `anchors_per_row`
    anchors per row (None: every eligible anchor; 0: none); with `judge`, target agreement
    (draftdeck.drafter.train.truth). With `sources` (each batch's row sources), the walk and agreement
    per source too."""
    was_training = drafter.training
    drafter.eval()
    total = Counts(drafter.slots)
    by_source: dict[str, Counts] = {}
    row_sources = iter(sources) if sources is not None else None
    try:
        for batch in batches:
            input_ids, attention_mask, loss_mask = batch
            tf = target.teacher_forced(input_ids, attention_mask, drafter.target_layer_ids)
            hidden_states = tf.context.to(next(drafter.parameters()).dtype)
            bsz, t = input_ids.shape
            positions = torch.arange(t, device=input_ids.device).expand(bsz, t)
            context = (hidden_states, drafter.context_kv(hidden_states, positions))
            runs, sampled = first_slots(
                drafter, target, batch, context, tf, gamma, per_row=anchors_per_row, seed=seed, mix=mix,
                attention=attention, anchors_per_chunk=anchors_per_chunk,
            )  # fmt: skip
            total = total + sampled
            steps = walk_steps(
                Drafts(drafter, target, batch, context, runs, attention), loss_mask.cpu().numpy()
            )
            names = list(next(row_sources)) if row_sources is not None else []
            total = total + tally(steps, target, tf, batch, judge, names, drafter.slots, by_source)
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
    anchors_per_row: int | None = 0,
    anchors_per_chunk: int = HELDOUT_ANCHORS_PER_CHUNK,
    attention: Backend = "blocked",
) -> Counts:
    """`heldout_pass` over every row together."""
    return heldout_pass(
        drafter, target, batches, gamma, judge=judge, anchors_per_row=anchors_per_row,
        anchors_per_chunk=anchors_per_chunk, attention=attention,
    )[0]  # fmt: skip
