"""The mix's distribution losses (rkl, jsd, tv, nla, lk_hybrid) through the target's head: the chunked
head's total and its gradients (hidden states, the head's weight and bias) equal a plain position-by-
position autograd reference written here in torch ops, over several chunks; the dense path too; a
weighted sum equals the sum of its parts; `--loss` names its terms or says which it takes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from draftdeck.drafter.model.head import head_loss
from draftdeck.drafter.model.loss_terms import Mix, parse_mix
from draftdeck.drafter.train.params import TrainParams

torch.set_num_threads(1)
VOCAB, HIDDEN, ROWS = 60, 8, 9
ETA = 2.5


def _case() -> tuple[nn.Linear, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    head = nn.Linear(HIDDEN, VOCAB)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=g) * 0.5)
        head.bias.copy_(torch.randn(VOCAB, generator=g) * 0.5)
    hidden = torch.randn(ROWS, HIDDEN, generator=g)
    # the teacher near the drafter: distributions that overlap, so every term is far from its edge
    teacher = hidden + 0.5 * torch.randn(ROWS, HIDDEN, generator=g)
    labels = torch.randint(0, VOCAB, (ROWS,), generator=g)
    weights = torch.rand(ROWS, generator=g) + 0.1
    return head, hidden, teacher, labels, weights


def _by_hand(name: str, z: torch.Tensor, t: torch.Tensor, label: int) -> torch.Tensor:
    """One position's loss from its drafter logits `z` and target logits `t` (V,), plain torch ops."""
    logq = torch.log_softmax(z, -1)
    logp = torch.log_softmax(t, -1).detach()
    p, q = logp.exp(), logq.exp()
    overlap = torch.minimum(p, q).sum()
    kl = (p * (logp - logq)).sum()
    if name == "ce":
        return -logq[label]
    if name == "kl":
        return kl
    if name == "rkl":
        return (q * (logq - logp)).sum()
    if name == "jsd":
        m = 0.5 * (p + q)
        return 0.5 * (p * (p / m).log()).sum() + 0.5 * (q * (q / m).log()).sum()
    if name == "tv":
        return 1 - overlap
    if name == "nla":
        return -overlap.log()
    assert name == "lk_hybrid"
    lam = math.exp(-ETA * float(overlap.detach()))  # sg[alpha]
    return lam * kl + (1 - lam) * (1 - overlap)


def _grads(head: nn.Linear, hidden: torch.Tensor) -> list[torch.Tensor]:
    assert hidden.grad is not None and head.weight.grad is not None and head.bias.grad is not None
    return [hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()]


def _through_head(mix: Mix, chunked: bool, chunk_bytes: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    head, hidden, teacher, labels, weights = _case()
    hidden.requires_grad_()
    out = head_loss(head, hidden, labels, weights, teacher=teacher, mix=mix, chunked=chunked,
                    chunk_bytes=chunk_bytes)  # fmt: skip
    out.total.backward()
    return out.total.detach(), _grads(head, hidden)


def _reference(terms: dict[str, float]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    head, hidden, teacher, labels, weights = _case()
    hidden.requires_grad_()
    total = torch.zeros(())
    for i in range(ROWS):  # position by position
        z = head(hidden[i])
        with torch.no_grad():
            t = head(teacher[i])
        per = sum(w * _by_hand(name, z, t, int(labels[i])) for name, w in terms.items())
        total = total + weights[i] * per
    total.backward()
    return total.detach(), _grads(head, hidden)


@pytest.mark.parametrize("name", ["rkl", "jsd", "tv", "nla", "lk_hybrid"])
def test_each_loss_chunked_and_dense_equal_the_position_by_position_reference(name: str) -> None:
    want_total, want_grads = _reference({name: 1.0})
    mix = Mix(((name, 1.0),), lk_eta=ETA)
    # 1 row a chunk (8 tensors of 60 floats alive), 3 rows, all at once; and the dense path
    for chunked, chunk_bytes in ((True, 4 * VOCAB * 8), (True, 4 * VOCAB * 8 * 3), (True, 2**20), (False, 0)):
        total, grads = _through_head(mix, chunked, chunk_bytes)
        torch.testing.assert_close(total, want_total, rtol=1e-5, atol=1e-5)
        for got, want in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert float(want_grads[0].abs().sum()) > 1e-3  # a gradient that says something


def test_a_weighted_sum_equals_the_sum_of_its_parts_and_ce_kl_keep_their_numbers() -> None:
    mix = parse_mix("0.5*ce+tv+2*jsd", lk_eta=ETA)
    assert mix.terms == (("ce", 0.5), ("tv", 1.0), ("jsd", 2.0))
    total, grads = _through_head(mix, True, 4 * VOCAB * 8 * 2)
    want_total, want_grads = _reference({"ce": 0.5, "tv": 1.0, "jsd": 2.0})
    torch.testing.assert_close(total, want_total, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # ce+kl as a Mix and as the older pair: bit-identical
    pair_total, pair_grads = _through_head((1.0, 1.0), True, 4 * VOCAB * 6)  # type: ignore[arg-type]
    mix_total, mix_grads = _through_head(parse_mix("ce+kl"), True, 4 * VOCAB * 6)
    assert torch.equal(pair_total, mix_total)
    assert all(torch.equal(a, b) for a, b in zip(pair_grads, mix_grads, strict=True))


def test_the_loss_names_its_terms_or_says_which_it_takes() -> None:
    assert parse_mix("ce+kl", ce_weight=2.0).terms == (("ce", 2.0), ("kl", 1.0))
    assert parse_mix("lk_hybrid", lk_eta=4.0) == Mix((("lk_hybrid", 1.0),), 4.0)
    with pytest.raises(
        ValueError, match="'kld' is not a loss term; give terms from ce, kl, rkl, jsd, tv, nla"
    ):
        parse_mix("ce+kld")
    with pytest.raises(ValueError, match="tv is given twice"):
        parse_mix("tv+0.5*tv")
    base = {"inputs": ["d"], "target": "t"}
    assert TrainParams(**base).mix == Mix((("ce", 1.0), ("kl", 1.0)))  # the default: ce+kl
    assert TrainParams(**base, loss="tv", lk_eta=2.0).mix == Mix((("tv", 1.0),), 2.0)
    assert TrainParams(**base, loss="kl", kl_weight=0.5).mix == Mix((("kl", 0.5),))
    with pytest.raises(ValueError, match="not a loss term"):
        TrainParams(**base, loss="cross")
    with pytest.raises(ValueError, match=r"needs the target's hidden states"):
        head, hidden, _, labels, weights = _case()
        head_loss(head, hidden, labels, weights, mix=parse_mix("tv"))
