"""The DFlash training objective over flattened blocks, and its counts.

For anchor position p (``loss_mask[p]`` and ``loss_mask[p + 1]`` are 1), the block is
``[ids[p], MASK x (B-1)]`` at positions p..p+B-1; slot k (1..B-1) predicts ``ids[p + k]``; slot 0
is the anchor itself and is never a label. The block sees target context strictly before p
(``key < p``: with ``<=`` the hidden state at p, which already encodes the target's next-token
prediction, leaks into slot 1 and real decoding collapses to tau ~ 1, SpecForge #455) and every
slot of its own block, nothing of other blocks. Labels at positions past the sequence or outside
the loss mask are not counted. Loss = sum w * CE / sum w with w_k = exp(-(k - 1) / gamma); with a
KL part (``mix`` = (ce_weight, kl_weight)), each slot's loss is ce_weight * CE + kl_weight *
KL(p || q), p the target's next-token distribution at the slot's position p + k (teacher-forced on the
row: its head on its final hidden state at p + k - 1), q the drafter's.

The DFlash family shares this objective. A drafter that drafts from the anchor (`sample_from_anchor`,
DSpark's default) predicts ``ids[p + j + 1]`` at slot j: its B drafts are counted as slots 1..B of a
verify block of B + 1 (`BlockBatch.slots`), slot 0 again the anchor. A drafter may add its own terms to
the target head's logits and loss, and choose its drafts otherwise than by the head's argmax: its
`slot_loss` and `slot_choice` (DSpark's Markov bias and confidence head, DFlash2's candidate selector),
which see each slot's previous token (the anchor for the first draft; teacher-forced, the data's).

The A anchors of a batch go through one drafter forward: (bsz, A * B) queries against
[T context keys ; A * B block keys], block-sparse (`draftdeck.drafter.model.attention.BlockLayout`: flex
attention, the project's blocked kernel, or dense SDPA as the reference); the loss goes through the
target's head in chunks of slots (`draftdeck.drafter.model.head`).

The weights w are the run's `--position-weights` (`draftdeck.drafter.kinds.dflash.position_weights`):
DFlash's decay above by default, `exp`, or D-PACE's, computed from each slot's CE in a pass without
gradients before the loss's own (its loss divides by the counted slots, not by sum w). Where a `gamma`
is taken, a `PositionWeights` may stand for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.position_weights import (
    PositionWeights,
    as_position_weights,
    batch_normalizer,
    counted_weights,
    dflash_weights,
    fixed_weights,
)
from draftdeck.drafter.model.attention import Backend, BlockLayout
from draftdeck.drafter.model.head import HeadOut, head_loss
from draftdeck.drafter.model.loss_terms import CE_ONLY, Mix, as_mix, describe_terms, term_words
from draftdeck.drafter.model.vocab_parallel import embed_rows
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.losses import leading_runs


def eligible_anchors(loss_mask: torch.Tensor) -> torch.Tensor:
    """(bsz, T) bool: positions p with loss_mask[p] and loss_mask[p + 1] (never the last column)."""
    m = loss_mask.bool()
    out = torch.zeros_like(m)
    out[:, :-1] = m[:, :-1] & m[:, 1:]
    return out


def sample_anchors(
    loss_mask: torch.Tensor, n: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `n` distinct random eligible anchors per row, ascending: (positions, valid), both
    (bsz, min(n, T)); padded entries have position 0 and valid False."""
    ok = eligible_anchors(loss_mask)
    n = min(n, ok.shape[1])
    noise = torch.rand(ok.shape, generator=generator, device="cpu").to(ok.device)
    score = torch.where(ok, noise, torch.full_like(noise, -1.0))
    top, idx = score.topk(n, dim=1)
    valid = top >= 0
    pos = torch.where(valid, idx, torch.full_like(idx, ok.shape[1]))
    pos, order = pos.sort(dim=1)
    valid = valid.gather(1, order)
    return torch.where(valid, pos, torch.zeros_like(pos)), valid


def all_anchors(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every eligible anchor, ascending: (positions, valid) padded to the row with the most."""
    ok = eligible_anchors(loss_mask)
    n = max(int(ok.sum(1).max()), 1)
    key = torch.where(ok, torch.arange(ok.shape[1], device=ok.device), ok.shape[1])
    pos = key.sort(dim=1).values[:, :n]
    valid = pos < ok.shape[1]
    return torch.where(valid, pos, torch.zeros_like(pos)), valid


def slot_weights(block_size: int, gamma: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """(B,) w_k = exp(-(k - 1) / gamma) for k >= 1, and 0 for the anchor slot."""
    return dflash_weights(block_size, gamma, device)


def counted_slots(
    loss_mask: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor, block_size: int
) -> torch.Tensor:
    """(bsz, A, B) bool: slot k of the block at each anchor has a label (k >= 1, p + k inside the
    sequence and the loss mask, the anchor not padding)."""
    bsz, t = loss_mask.shape
    slot_pos = anchors[:, :, None] + torch.arange(block_size, device=anchors.device)
    safe = slot_pos.clamp(max=t - 1).view(bsz, -1)
    out = (slot_pos < t) & loss_mask.bool().gather(1, safe).view(slot_pos.shape) & valid[:, :, None]
    out[:, :, 0] = False
    return out


def label_weight_sum(
    loss_mask: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor, block_size: int,
    gamma: float | PositionWeights,
) -> float:  # fmt: skip
    """Sum of w over the counted slots: the loss's denominator, known before any forward (so that
    micro-batches and ranks can share one global normaliser). `gamma`: DFlash's, or the run's
    `PositionWeights` (D-PACE's denominator counts the slots: `position_weights.fixed_weights`)."""
    sel = counted_slots(loss_mask, anchors, valid, block_size)
    return float((fixed_weights(as_position_weights(gamma), block_size, loss_mask.device) * sel).sum())


@dataclass
class BlockBatch:
    """The drafter's inputs and the labels for A blocks per row. Shapes: anchors/valid (bsz, A);
    block_ids (bsz, A*B); position_ids (bsz, T + A*B); `layout`: who sees whom (its `dense_mask()`
    is (bsz, 1, A*B, T + A*B)); labels/label_valid (bsz, A, B + shift)."""

    block_size: int
    anchors: torch.Tensor
    valid: torch.Tensor
    block_ids: torch.Tensor
    position_ids: torch.Tensor
    layout: BlockLayout
    labels: torch.Tensor
    label_valid: torch.Tensor
    shift: int = 0  # 1: slot j of the block drafts the token at p + j + 1 (drafting from the anchor)

    @property
    def slots(self) -> int:
        """Slots of the verify block the drafts are counted in: the anchor, then the drafts."""
        return self.block_size + self.shift

    def previous(self) -> torch.Tensor:
        """(bsz, A, slots) each slot's previous token (the anchor for the first draft): what a
        drafter's own heads condition a draft on, teacher-forced."""
        return torch.cat([self.labels[:, :, :1], self.labels[:, :, :-1]], dim=2)


def build_blocks(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    block_size: int,
    mask_token_id: int,
    backend: Backend = "blocked",
    shift: int = 0,
) -> BlockBatch:
    bsz, t = input_ids.shape
    a, b = anchors.shape[1], block_size
    dev = input_ids.device
    slot_pos = anchors[:, :, None] + torch.arange(
        b, device=dev
    )  # (bsz, A, B): absolute position of each slot
    block_ids = torch.full((bsz, a, b), mask_token_id, dtype=input_ids.dtype, device=dev)
    block_ids[:, :, 0] = input_ids.gather(1, anchors)
    label_pos = anchors[:, :, None] + torch.arange(b + shift, device=dev)  # the verify block's slots
    safe = label_pos.clamp(max=t - 1).view(bsz, -1)
    labels = input_ids.gather(1, safe).view(bsz, a, b + shift)
    label_valid = counted_slots(loss_mask, anchors, valid, b + shift)
    key_ok = None if attention_mask is None else attention_mask.bool()
    layout = BlockLayout(anchors, key_ok, t, b, backend)  # context strictly before the anchor
    keys = torch.arange(t, device=dev)
    position_ids = torch.cat([keys.expand(bsz, t), slot_pos.view(bsz, -1)], dim=1)
    return BlockBatch(
        b, anchors, valid, block_ids.view(bsz, -1), position_ids, layout, labels, label_valid, shift
    )


ContextKV = list[tuple[torch.Tensor, torch.Tensor]]  # DFlashDrafter.context_kv: per layer (k, v)


def drafter_hidden(
    drafter: nn.Module,
    embedding: nn.Module,
    context: torch.Tensor,
    batch: BlockBatch,
    context_kv: ContextKV | None = None,
) -> torch.Tensor:
    """The drafter's final hidden states for every slot of the verify block: (bsz, A, B + shift, H)
    (a drafter that drafts from the anchor: its slot j at slot j + 1, slot 0 zeros, never read). With
    `context_kv` (the context's keys and values, computed once for several groups of anchors) only the
    blocks run."""
    noise = embed_rows(embedding, batch.block_ids)
    if context_kv is not None:
        t = batch.layout.context_len
        core = cast(DFlashDrafter, getattr(drafter, "module", drafter))
        h = core.block_forward(noise, batch.position_ids[:, t:], batch.layout, context_kv)
    else:
        h = drafter(
            position_ids=batch.position_ids,
            attention_mask=batch.layout,
            noise_embedding=noise,
            target_hidden=context,
        )
    bsz, a = batch.anchors.shape
    h = h.view(bsz, a, batch.block_size, -1)
    return torch.cat([h.new_zeros(bsz, a, batch.shift, h.shape[-1]), h], dim=2) if batch.shift else h


@dataclass
class BlockResult:
    """`loss` (a scalar with grad, 0 when nothing is counted), `counts` (per-slot, anchor-mean),
    `runs` (bsz, A) leading correct run per block (-1 for padded anchors), `predictions`
    (bsz, A, B) argmax per slot (slot 0 = the anchor token)."""

    loss: torch.Tensor
    counts: Counts
    runs: torch.Tensor
    predictions: torch.Tensor


def loss_formula(mix: Mix | tuple[float, float]) -> str:
    """The objective in words, as run.json records it."""
    mix = as_mix(mix)
    words = {
        "ce": "CE_k",
        "kl": "KL(p_target || q_draft)_k",
        **{n: f"{w}_k" for n, w in term_words(mix).items()},
    }
    per_slot = describe_terms(mix, words)
    return f"dflash: sum_k w_k ({per_slot}) / sum_k w_k, w_k = exp(-(k-1)/gamma), slot 0 excluded"


def teacher_rows(teacher: torch.Tensor, batch: BlockBatch) -> torch.Tensor:
    """(N, H): the target's final hidden state before each counted slot's token (position p + k - 1),
    in the order of ``batch.labels[batch.label_valid]``."""
    row, anchor, k = batch.label_valid.nonzero(as_tuple=True)
    return teacher[row, batch.anchors[row, anchor] + k - 1]


def counted_slot_loss(
    logits_fn: nn.Module,
    hidden: torch.Tensor,
    batch: BlockBatch,
    w: torch.Tensor,
    *,
    teacher: torch.Tensor | None = None,
    mix: Mix = CE_ONLY,
    drafter: nn.Module | None = None,
    chunked: bool = True,
) -> HeadOut:
    """The head's output over `batch`'s counted slots weighted `w` (N,): through `drafter`'s own
    `slot_loss` where it has its own terms (DSpark's Markov bias, DFlash2's selector), else the
    target's head. `teacher` (N, H) the target's rows before each slot (`teacher_rows`)."""
    sel = batch.label_valid
    labels = batch.labels[sel]
    if drafter is None:
        return head_loss(logits_fn, hidden[sel], labels, w, teacher=teacher, mix=mix, chunked=chunked)
    previous = batch.previous()
    features = drafter.block_features(hidden, previous)  # type: ignore[operator]
    return drafter.slot_loss(  # type: ignore[operator]
        logits_fn, hidden[sel], previous[sel], None if features is None else features[sel], labels, w,
        teacher=teacher, mix=mix, chunked=chunked,
    )  # fmt: skip


def counted_slot_ce(
    logits_fn: nn.Module, hidden: torch.Tensor, batch: BlockBatch, drafter: nn.Module | None = None,
    chunked: bool = True,
) -> torch.Tensor:  # fmt: skip
    """(N,) each counted slot's cross-entropy against its label, without gradients (D-PACE's input):
    `counted_slot_loss` with zero weights and no teacher, in the head's chunks."""
    with torch.no_grad():
        zeros = torch.zeros(int(batch.label_valid.sum()), dtype=torch.float32, device=hidden.device)
        return counted_slot_loss(
            logits_fn, hidden.detach(), batch, zeros, drafter=drafter, chunked=chunked
        ).ce


def block_loss(
    logits_fn: nn.Module,
    hidden: torch.Tensor,
    batch: BlockBatch,
    gamma: float | PositionWeights,
    normalizer: float | None = None,
    *,
    chunked_head: bool = True,
    teacher: torch.Tensor | None = None,
    mix: Mix = CE_ONLY,
    drafter: nn.Module | None = None,
) -> BlockResult:
    """Weighted loss over counted slots (logits only for those, in chunks), per-slot and anchor-mean
    counts. With `teacher` (the target's final hidden states, (bsz, T, H)) the KL part of `mix` is
    computed, and the expected acceptance per slot counted. With `drafter`, its `slot_loss` gives each
    slot's loss and draft (its own heads' terms beside the target head's).

    `logits_fn` maps (N, H) -> (N, V): the target's LM head (or any stand-in in tests; an
    `nn.Linear` goes through `draftdeck.drafter.model.head`'s chunks unless `chunked_head` is False, the
    reference). The loss is sum w * CE / `normalizer` (default: this batch's sum w; the trainer
    passes the global sum over micro-batches and ranks, and sums the gradients over ranks)."""
    sel = batch.label_valid
    labels = batch.labels[sel]
    w = counted_weights(gamma, sel, lambda: counted_slot_ce(logits_fn, hidden, batch, drafter, chunked_head))
    rows = teacher_rows(teacher, batch) if teacher is not None else None
    out = counted_slot_loss(
        logits_fn, hidden, batch, w, teacher=rows, mix=mix, drafter=drafter, chunked=chunked_head
    )
    pred_sel = out.pred
    wsum = batch_normalizer(gamma, w)  # sum w; D-PACE's: the counted slots
    denom = wsum if normalizer is None else torch.tensor(normalizer, device=hidden.device)
    loss = out.total / denom if sel.any() else hidden.sum() * 0.0
    predictions = batch.labels.clone()
    predictions[:, :, 1:] = 0
    predictions[sel] = pred_sel
    correct = torch.zeros_like(sel)
    correct[sel] = pred_sel == labels
    runs = leading_runs(correct, batch.valid)
    mix = as_mix(mix)
    per_slot = out.ce if out.kl is None else mix.ce * out.ce + mix.kl * out.kl
    if out.others is not None:  # the mix's terms beyond ce and kl
        per_slot = per_slot + out.others
    if out.extra is not None:  # the drafter's own heads' loss per slot
        per_slot = per_slot + out.extra
    counts = counts_of(batch, correct, per_slot, w)
    if out.accept is not None and out.draft_prob is not None:
        per = torch.zeros((2, *sel.shape), dtype=torch.float32, device=sel.device)
        per[0][sel], per[1][sel] = out.accept, out.draft_prob
        sums = per.sum(dim=(1, 2)).tolist()
        counts.accept_sum, counts.draft_prob_sum = sums[0], sums[1]
        counts.accept_total = list(counts.total)
    return BlockResult(loss, counts, runs, predictions)


def counts_of(batch: BlockBatch, correct: torch.Tensor, loss: torch.Tensor, w: torch.Tensor) -> Counts:
    b = batch.slots
    sel = batch.label_valid
    runs = leading_runs(correct, batch.valid)[batch.valid]
    c = Counts(b)
    c.correct = [int(x) for x in correct.sum(dim=(0, 1)).tolist()]
    c.total = [int(x) for x in sel.sum(dim=(0, 1)).tolist()]
    c.anchor_accepted = int(runs.sum())
    c.anchor_blocks = int(runs.numel())
    c.anchor_hist = [int(x) for x in torch.bincount(runs + 1, minlength=b + 1).tolist()]
    c.loss_sum = float((w * loss).sum())
    c.weight_sum = float(w.sum())
    return c


def dflash_loss(
    drafter: nn.Module,
    embedding: nn.Module,
    lm_head: nn.Module,
    context: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    gamma: float | PositionWeights,
    normalizer: float | None = None,
    *,
    attention: Backend = "blocked",
    chunked_head: bool = True,
    context_kv: ContextKV | None = None,
    teacher: torch.Tensor | None = None,
    mix: Mix = CE_ONLY,
) -> BlockResult:
    """The whole objective for one batch: `context` = the target's concatenated features
    (bsz, T, n_ids * H) for `input_ids` (bsz, T). `drafter` is a `DFlashDrafter` (or a module
    wrapping one as `module`, whose forward is the one called)."""
    as_position_weights(gamma)  # a ValueError for a gamma that is not a positive number
    core = cast(DFlashDrafter, getattr(drafter, "module", drafter))  # a wrapper's `module`
    batch = build_blocks(
        input_ids, loss_mask, attention_mask, anchors, valid, core.block_size, core.mask_token_id, attention,
        core.shift,
    )  # fmt: skip
    hidden = drafter_hidden(drafter, embedding, context, batch, context_kv)
    return block_loss(
        lm_head, hidden, batch, gamma, normalizer, chunked_head=chunked_head, teacher=teacher, mix=mix,
        drafter=drafter,
    )  # fmt: skip


def dflash_backward(
    drafter: DFlashDrafter,
    embedding: nn.Module,
    lm_head: nn.Module,
    context: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    gamma: float | PositionWeights,
    normalizer: float,
    *,
    anchors_per_forward: int,
    attention: Backend = "blocked",
    chunked_head: bool = True,
    teacher: torch.Tensor | None = None,
    mix: Mix = CE_ONLY,
) -> Counts:
    """Forward and backward of the objective over `anchors` in groups of `anchors_per_forward`
    (gradients accumulate in the drafter; returns the counts).

    The context's part of the drafter (fc, norm, every layer's context keys and values) does not
    depend on the anchors: it runs once, each group's graph is freed by its own backward against
    detached copies, and the context's gradient goes back through it once at the end. The sum of
    the groups' losses is the one-forward loss (`normalizer` is global), so are the gradients."""
    bsz, t = input_ids.shape
    positions = torch.arange(t, device=input_ids.device).expand(bsz, t)
    shared = drafter.context_kv(context, positions)
    leaves = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in shared]
    counts = Counts(drafter.slots)
    per = max(1, anchors_per_forward)
    for s in range(0, max(anchors.shape[1], 1), per):
        res = dflash_loss(
            drafter, embedding, lm_head, context, input_ids, loss_mask, attention_mask,
            anchors[:, s : s + per], valid[:, s : s + per], gamma, normalizer,
            attention=attention, chunked_head=chunked_head, context_kv=leaves, teacher=teacher, mix=mix,
        )  # fmt: skip
        res.loss.backward()
        counts = counts + res.counts
    outs, grads = [], []
    for pair, leaf_pair in zip(shared, leaves, strict=True):
        for out, leaf in zip(pair, leaf_pair, strict=True):
            if leaf.grad is not None:
                outs.append(out)
                grads.append(leaf.grad)
    if outs:
        torch.autograd.backward(outs, grads)
    return counts


def sample_anchors_per_row(
    loss_mask: torch.Tensor, lengths: list[int], n: int, generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_anchors` row by row on each unpadded row with its own generator, so that a row's
    anchors depend only on the row and its generator (not on padding or batch-mates)."""
    rows = [
        sample_anchors(loss_mask[i : i + 1, :ln], n, g)
        for i, (ln, g) in enumerate(zip(lengths, generators, strict=True))
    ]
    width = max(p.shape[1] for p, _ in rows)
    pos = torch.zeros(len(rows), width, dtype=torch.long, device=loss_mask.device)
    valid = torch.zeros(len(rows), width, dtype=torch.bool, device=loss_mask.device)
    for i, (p, v) in enumerate(rows):
        pos[i, : p.shape[1]], valid[i, : v.shape[1]] = p[0], v[0]
    return pos, valid


def pad_anchors(anchors: torch.Tensor, valid: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchors, valid) widened to `width` columns with padded entries (position 0, not valid): no
    slot of theirs is counted, so the loss, gradients and counts are those of the narrower batch."""
    extra = width - anchors.shape[1]
    if extra <= 0:
        return anchors, valid
    return F.pad(anchors, (0, extra)), F.pad(valid, (0, extra), value=False)
