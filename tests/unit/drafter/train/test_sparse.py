"""Training at real lengths: the block-sparse attention, the chunked LM head, anchors in several
forwards and activation checkpointing all give the dense reference's loss, counts and gradients.

Tolerances: float32 1e-5 (relative to the largest value compared; only summation order differs),
bfloat16 2e-2 (one bf16 rounding of values of order 1)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.objective import (
    dflash_backward,
    dflash_loss,
    label_weight_sum,
    sample_anchors,
)
from draftdeck.drafter.kinds.dflash.walked import heldout_counts
from draftdeck.drafter.model import attention as attn
from draftdeck.drafter.model.attention import BlockLayout, resolve_backend
from draftdeck.drafter.model.head import head_loss
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.data import collate
from tests.support.drafter import tiny_drafter_config, tiny_target

torch.set_num_threads(1)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    a, b = a.detach().float(), b.detach().float()
    scale = max(float(a.abs().max()), 1.0)
    err = float((a - b).abs().max())
    assert err <= tol * scale, f"max error {err:.3g} over scale {scale:.3g}"


def _layout_case(b: int, *, left_pad: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    bsz, t, a = 2, 40, 6
    g = torch.Generator().manual_seed(b)
    anchors = torch.sort(torch.randint(1, t - 1, (bsz, a), generator=g), 1).values
    anchors[0, 0], anchors[0, -1] = 0, t - 1  # anchors at both ends
    anchors[1, -2:] = 0  # padding anchors: position 0, no context
    key_ok = torch.ones(bsz, t, dtype=torch.bool)
    if left_pad:
        key_ok[1, :7] = False
    else:
        key_ok[1, 30:] = False
    return anchors, key_ok, t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b", [2, 8, 16])
def test_blocked_attention_equals_dense_values_and_gradients(
    b: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    heads, kv_heads, d = 4, 2, 16  # grouped-query attention
    anchors, key_ok, t = _layout_case(b, left_pad=b == 8)
    # a small score budget: several chunks of anchors per call
    monkeypatch.setattr(attn, "SCORE_CHUNK_BYTES", 2 * 2 * heads * b * t * 4)
    g = torch.Generator().manual_seed(0)
    q_len = anchors.shape[1] * b
    q = torch.randn(2, heads, q_len, d, generator=g).to(dtype).requires_grad_()
    k = torch.randn(2, kv_heads, t + q_len, d, generator=g).to(dtype).requires_grad_()
    v = torch.randn(2, kv_heads, t + q_len, d, generator=g).to(dtype).requires_grad_()
    grad_out = torch.randn(2, heads, q_len, d, generator=g).to(dtype)
    got = {}
    for backend in ("dense", "blocked"):
        layout = BlockLayout(anchors, key_ok, t, b, backend)
        out = layout.attend(q, k[:, :, :t], k[:, :, t:], v[:, :, :t], v[:, :, t:], d**-0.5)
        got[backend] = (out, *torch.autograd.grad(out, (q, k, v), grad_out))
    assert len(attn._chunks(BlockLayout(anchors, key_ok, t, b), heads)) > 1
    for dense, blocked in zip(got["dense"], got["blocked"], strict=True):
        _close(dense, blocked, TOL[dtype])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_mask_is_the_dense_mask() -> None:
    """The flex block mask's rule, evaluated eagerly on the CPU (its forward runs there; its
    backward needs CUDA), gives the dense path's output."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, heads, d = 4, 2, 8
    anchors, key_ok, t = _layout_case(b, left_pad=True)
    layout = BlockLayout(anchors, key_ok, t, b, "flex")
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, heads, layout.queries, d, generator=g)
    k = torch.randn(2, heads, t + layout.queries, d, generator=g)
    v = torch.randn(2, heads, t + layout.queries, d, generator=g)
    rule = attn.flex_rule(layout)
    mask = create_block_mask(rule, 2, None, layout.queries, t + layout.queries, device="cpu")
    with torch.no_grad():
        flex = flex_attention(q, k, v, block_mask=mask, scale=d**-0.5)
        dense = BlockLayout(anchors, key_ok, t, b, "dense").attend(
            q, k[:, :, :t], k[:, :, t:], v[:, :, :t], v[:, :, t:], d**-0.5
        )
    _close(dense, flex, 1e-5)


def test_backend_choice_is_automatic_and_a_forced_flex_without_cuda_is_refused() -> None:
    assert resolve_backend("auto", torch.device("cpu")) == "blocked"
    assert resolve_backend("dense", torch.device("cpu")) == "dense"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_backend("flex", torch.device("cpu"))


def _grad(t: torch.Tensor) -> torch.Tensor:
    """A copy of the gradient the backward pass left on `t`."""
    assert t.grad is not None
    return t.grad.clone()


def test_chunked_head_equals_the_unchunked_loss_gradients_and_argmax() -> None:
    g = torch.Generator().manual_seed(2)
    head = nn.Linear(16, 50, bias=True)  # a head with a bias, whose weight requires grad too
    hidden = torch.randn(37, 16, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (37,), generator=g)
    w = torch.rand(37, generator=g)
    got = []
    for chunked in (False, True):
        head.zero_grad()
        hidden.grad = None
        out = head_loss(head, hidden, labels, w, chunked=chunked, chunk_bytes=4 * 50 * 5)
        wce, ce, pred = out.total, out.ce, out.pred
        (wce * 0.5).backward()
        grads = (_grad(hidden), _grad(head.weight), _grad(head.bias))
        got.append((wce.detach(), ce, pred, *grads))
    (ref, new) = got
    for a, b in zip(ref, new, strict=True):
        if a.dtype == torch.long:
            assert torch.equal(a, b)
        else:
            _close(a, b, 1e-5)
    with torch.no_grad():  # the held-out walk's path: no gradients kept
        out = head_loss(head, hidden, labels, w, chunk_bytes=4 * 50 * 5)
        wce, ce, pred = out.total, out.ce, out.pred
    _close(ref[0], wce, 1e-5)
    assert torch.equal(ref[2], pred)


def _world(b: int, seed: int = 0) -> tuple[DFlashDrafter, Target, tuple[torch.Tensor, ...]]:
    target = tiny_target(seed)
    torch.manual_seed(seed)
    drafter = DFlashDrafter(tiny_drafter_config(target, layers=2, block_size=b))
    g = torch.Generator().manual_seed(seed)
    lengths = (48, 21, 33)  # padded rows, one short
    examples = []
    for n in lengths:
        ids = torch.randint(3, 290, (n,), generator=g)
        lm = torch.zeros(n, dtype=torch.long)
        lm[n // 3 :] = 1
        examples.append((ids.numpy(), lm.numpy()))
    ids, att, lm = collate(examples, 0)
    anchors, valid = sample_anchors(lm, 12, g)
    return drafter, target, (ids, att, lm, anchors, valid)


def _loss_and_grads(
    drafter, target, batch, *, attention, chunked_head, split=None, recompute=False, mix=(1.0, 0.0)
):
    """One forward (dflash_loss) or, with `split`, the trainer's groups of anchors (dflash_backward);
    a `mix` with a KL part reads the target's final hidden states, as the trainer does."""
    ids, att, lm, anchors, valid = batch
    drafter.zero_grad()
    drafter.gradient_checkpointing = recompute
    drafter.train()
    norm = label_weight_sum(lm, anchors, valid, drafter.block_size, 7.0)
    tf = target.teacher_forced(ids, att, drafter.target_layer_ids)
    ctx, teacher = tf.context, (tf.last_hidden if mix[1] else None)
    common = (drafter, target.embedding, target.lm_head, ctx, ids, lm, att, anchors, valid, 7.0, norm)
    if split is None:
        res = dflash_loss(*common, attention=attention, chunked_head=chunked_head, teacher=teacher, mix=mix)
        res.loss.backward()
        loss, counts = float(res.loss.detach()), res.counts
    else:
        counts = dflash_backward(
            *common, anchors_per_forward=split, attention=attention, chunked_head=chunked_head,
            teacher=teacher, mix=mix,
        )  # fmt: skip
        loss = counts.loss_sum / norm
    grads = torch.cat([p.grad.flatten() for p in drafter.parameters()])
    return loss, counts, grads


@pytest.mark.parametrize("b", [2, 8, 16])
def test_sparse_training_step_equals_the_dense_reference(b: int) -> None:
    drafter, target, batch = _world(b)
    ref = _loss_and_grads(drafter, target, batch, attention="dense", chunked_head=False)
    new = _loss_and_grads(drafter, target, batch, attention="blocked", chunked_head=True)
    assert abs(ref[0] - new[0]) <= 1e-5 * abs(ref[0])
    assert ref[1].correct == new[1].correct and ref[1].total == new[1].total
    assert ref[1].anchor_hist == new[1].anchor_hist and sum(ref[1].total) > 0
    _close(ref[2], new[2], 1e-5)
    assert float(ref[2].abs().sum()) > 0


def test_anchors_in_several_forwards_and_recomputed_layers_give_the_same_step() -> None:
    drafter, target, batch = _world(8, seed=3)
    one = _loss_and_grads(drafter, target, batch, attention="blocked", chunked_head=True)
    split = _loss_and_grads(drafter, target, batch, attention="blocked", chunked_head=True, split=5)
    again = _loss_and_grads(drafter, target, batch, attention="blocked", chunked_head=True, recompute=True)
    both = _loss_and_grads(
        drafter, target, batch, attention="dense", chunked_head=False, split=5, recompute=True
    )
    for other in (split, again, both):
        assert abs(one[0] - other[0]) <= 1e-5 * abs(one[0])
        assert one[1].correct == other[1].correct and one[1].anchor_hist == other[1].anchor_hist
        _close(one[2], other[2], 1e-5)


@pytest.mark.parametrize("mix", [(0.0, 1.0), (1.0, 0.5)])
def test_a_kl_step_equals_the_dense_reference_and_counts_expected_acceptance(
    mix: tuple[float, float],
) -> None:
    drafter, target, batch = _world(8, seed=2)
    ref = _loss_and_grads(drafter, target, batch, attention="dense", chunked_head=False, mix=mix)
    new = _loss_and_grads(drafter, target, batch, attention="blocked", chunked_head=True, mix=mix)
    split = _loss_and_grads(drafter, target, batch, attention="blocked", chunked_head=True, split=5, mix=mix)
    ce = _loss_and_grads(drafter, target, batch, attention="blocked", chunked_head=True)
    for other in (new, split):  # the chunked KL sums dot products: float32 cancellation, absolute
        assert abs(ref[0] - other[0]) <= 1e-5 * abs(ref[0]) + 1e-6
        _close(ref[2], other[2], 1e-5)
        assert other[1].accept_total == other[1].total and sum(other[1].total) > 0
        both = [c.accept_sum + c.draft_prob_sum for c in (ref[1], other[1])]
        for a, b in zip(*both, strict=True):
            assert abs(a - b) <= 1e-4 * max(abs(a), 1.0)
    # a probability per counted slot: between 0 and 1 on average; the CE-only step measures none
    assert all(0 < s / t <= 1 for s, t in zip(ref[1].accept_sum[1:], ref[1].total[1:], strict=True) if t)
    assert sum(ce[1].accept_total) == 0 and abs(ce[0] - ref[0]) > 1e-3  # another loss, measured apart


def test_walked_tau_is_identical_either_way() -> None:
    drafter, target, (ids, att, lm, _, _) = _world(4, seed=5)
    got = {
        backend: heldout_counts(drafter, target, [(ids, att, lm)], 7.0, judge=False, attention=backend)
        for backend in ("dense", "blocked")
    }
    dense, blocked = got["dense"], got["blocked"]
    assert dense.walked_steps > 0
    assert (dense.walked_steps, dense.walked_accepted, dense.walked_hist) == (
        blocked.walked_steps,
        blocked.walked_accepted,
        blocked.walked_hist,
    )
    assert dense.correct == blocked.correct and dense.total == blocked.total
