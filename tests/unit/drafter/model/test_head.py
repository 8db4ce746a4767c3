"""The loss through the target's head: CE, forward KL from the target's distribution, and both, chunked
exactly as the dense reference (value, per-slot parts, gradients), and the expected acceptances (a
sampling drafter's sum min(p, q), a greedy drafter's p of its argmax) checked by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from draftdeck.drafter.model.head import head_loss

torch.set_num_threads(1)


def _case(seed: int = 0) -> tuple[nn.Linear, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(16, 50)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 16, generator=g))
        head.bias.copy_(torch.randn(50, generator=g))
    hidden = torch.randn(37, 16, generator=g, requires_grad=True)
    teacher = torch.randn(37, 16, generator=g)
    labels = torch.randint(0, 50, (37,), generator=g)
    weights = torch.rand(37, generator=g) + 0.1
    return head, hidden, teacher, labels, weights


@pytest.mark.parametrize("mix", [(1.0, 0.0), (0.0, 1.0), (0.5, 2.0)])
def test_chunked_equals_dense_in_value_parts_and_gradients(mix: tuple[float, float]) -> None:
    head, hidden, teacher, labels, weights = _case()
    got: list[tuple[Any, ...]] = []  # (the loss's parts, the three gradients)
    for chunked in (False, True):
        head.zero_grad()
        hidden.grad = None
        out = head_loss(head, hidden, labels, weights, teacher=teacher, mix=mix, chunked=chunked,
                        chunk_bytes=4 * 50 * 6)  # fmt: skip
        (out.total * 0.5).backward()
        assert hidden.grad is not None and head.weight.grad is not None and head.bias.grad is not None
        got.append((out, hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()))
    (ref, *ref_grads), (new, *new_grads) = got
    for name in ("total", "ce", "kl", "accept", "draft_prob"):
        torch.testing.assert_close(
            getattr(new, name).detach(), getattr(ref, name).detach(), rtol=1e-5, atol=1e-5
        )
    assert torch.equal(new.pred, ref.pred) and torch.equal(new.target_pred, ref.target_pred)
    for a, b in zip(ref_grads, new_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # the held-out walk's path: the same parts, no gradients
        quiet = head_loss(head, hidden, labels, weights, teacher=teacher, mix=mix, chunk_bytes=4 * 50 * 6)
    torch.testing.assert_close(quiet.accept, ref.accept, rtol=1e-5, atol=1e-5)


def test_kl_and_its_gradient_by_hand() -> None:
    """KL(p || q) on hand-built logits, and its gradient w * (q - p) through the head."""
    head = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    drafter_logits = torch.tensor([[2.0, 0.0, -1.0]], requires_grad=True)
    target_logits = torch.tensor([[0.0, 1.0, 0.0]])
    out = head_loss(head, drafter_logits, torch.tensor([1]), torch.tensor([2.0]), teacher=target_logits,
                    mix=(0.0, 1.0), chunk_bytes=4 * 3)  # fmt: skip
    p, q = F.softmax(target_logits, -1)[0], F.softmax(drafter_logits.detach(), -1)[0]
    kl = sum(float(p[i]) * math.log(float(p[i]) / float(q[i])) for i in range(3))
    assert out.kl is not None and out.accept is not None
    assert float(out.kl[0]) == pytest.approx(kl, rel=1e-6) and float(out.total.detach()) == pytest.approx(
        2 * kl, rel=1e-6
    )
    assert float(out.accept[0]) == pytest.approx(
        sum(min(float(p[i]), float(q[i])) for i in range(3)), rel=1e-6
    )
    out.total.backward()
    assert drafter_logits.grad is not None
    torch.testing.assert_close(drafter_logits.grad[0], 2.0 * (q - p))
    assert (int(out.pred[0]), int(out.target_pred[0])) == (0, 1)  # type: ignore[index]
    assert out.draft_prob is not None  # a greedy drafter's token 0, as a T = 1 target accepts it: p[0]
    assert float(out.draft_prob[0]) == pytest.approx(float(p[0]), rel=1e-6)


def test_expected_acceptance_is_one_for_equal_distributions_and_a_kl_needs_its_teacher() -> None:
    head, hidden, _, labels, weights = _case(1)
    out = head_loss(head, hidden, labels, weights, teacher=hidden.detach(), mix=(0.0, 1.0))
    assert out.kl is not None and out.accept is not None
    torch.testing.assert_close(out.accept, torch.ones(37), atol=1e-5, rtol=0)  # the same distribution
    torch.testing.assert_close(out.kl, torch.zeros(37), atol=1e-4, rtol=0)  # float32 cancellation
    with pytest.raises(ValueError, match="needs the target's hidden states"):
        head_loss(head, hidden, labels, weights, mix=(1.0, 1.0))
    plain = head_loss(head, hidden, labels, weights)
    assert plain.kl is None and plain.accept is None


@pytest.mark.parametrize("mix", [(1.0, 0.0), (0.5, 2.0)])
def test_a_drafter_s_low_rank_term_chunked_equals_the_dense_logits(mix: tuple[float, float]) -> None:
    """DSpark's Markov bias u W2^T added to the target head's logits: the chunked path's loss, parts
    and gradients (for the hidden states, u and W2; none for the frozen head) are the reference's, and
    the reference is the plain loss over (head(h) + u W2^T)."""
    head, hidden, teacher, labels, weights = _case(1)
    head.requires_grad_(False)
    g = torch.Generator().manual_seed(5)
    u = torch.randn(37, 4, generator=g, requires_grad=True)
    w2 = torch.randn(50, 4, generator=g, requires_grad=True)
    got = []
    for chunked in (False, True):
        for t in (hidden, u, w2):
            t.grad = None
        out = head_loss(head, hidden, labels, weights, teacher=teacher, mix=mix, chunked=chunked,
                        chunk_bytes=4 * 50 * 6, low_rank=(u, w2))  # fmt: skip
        (out.total * 0.5).backward()
        got.append((out, [t.grad.clone() for t in (hidden, u, w2)]))  # type: ignore[union-attr]
    (ref, ref_grads), (new, new_grads) = got
    for name in ("total", "ce", "accept"):
        torch.testing.assert_close(
            getattr(new, name).detach(), getattr(ref, name).detach(), rtol=1e-5, atol=1e-5
        )
    assert torch.equal(new.pred, ref.pred)
    for a, b in zip(ref_grads, new_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    logits = hidden @ head.weight.T + head.bias + u @ w2.T  # by hand: the biased logits' CE
    ce = F.cross_entropy(logits, labels, reduction="none")
    torch.testing.assert_close(ref.ce, ce.detach(), rtol=1e-5, atol=1e-5)
    assert torch.equal(ref.pred, logits.argmax(-1))
