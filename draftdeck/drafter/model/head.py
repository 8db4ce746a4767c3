"""The drafter's loss through the target's LM head (cross-entropy, forward KL from the target, or
both), without the logits wall.

The drafter's counted slots go through the target's frozen head: with Qwen3.6's 248K vocabulary
and 512 anchors x 15 slots the float32 logits are ~7.6 GB per sequence, and autograd keeps them
(and their gradient) for the backward. `head_loss` computes the loss, its gradient, the argmax and
each slot's CE in chunks of slots (`LOGITS_CHUNK_BYTES` of float32 logits at a time) and keeps
only the gradient with respect to the hidden states, (N, H): the same two matmuls per slot as the
unchunked path (logits, then dlogits @ W), one chunk of logits alive at a time. The KL needs the
target's own logits at each slot (its final hidden state before the slot's token, through the same
head): one more matmul per slot, three (rows, V) tensors alive, so a chunk holds a third of the slots
and the peak stays the CE's.

A head split by vocabulary across ranks (`draftdeck.drafter.model.vocab_parallel.ShardedHead`)
goes through the same chunks over its slice: the reductions over the vocabulary (log-sum-exp,
argmax, a label's logit, the KL's and acceptance's sums) are its shard's, and the gradient with
respect to the hidden states is summed over the slices.

The mix's other terms (`draftdeck.drafter.train.losses`: rkl, jsd, tv, nla, lk_hybrid) go through the
same chunks: each is a sum over the vocabulary per slot (summed over the slices) and its gradient with
respect to the logits q * (g - sum q g), g its gradient with respect to q. They keep more (rows, V)
tensors alive (the target's log-probabilities, the drafter's, a gradient and two temporaries), so a
chunk holds fewer slots and the peak stays the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from draftdeck.drafter.model.loss_terms import Mix, as_mix, term_value
from draftdeck.drafter.model.vocab_parallel import ShardedHead, WholeVocab

LOGITS_CHUNK_BYTES = 64 * 2**20  # 64 MiB of float32 logits: 256 slots of a 64K vocabulary


def rows_per_chunk(vocab: int, chunk_bytes: int = LOGITS_CHUNK_BYTES) -> int:
    return max(1, chunk_bytes // (4 * max(vocab, 1)))


def _alive(teacher: torch.Tensor | None, mix: Mix) -> int:
    """How many (rows, V) float32 tensors a chunk keeps alive at once: the logits; with a teacher the
    target's and a gradient (3); with the mix's other terms also both log-probabilities and the
    temporaries of their gradients (8)."""
    if teacher is None:
        return 1
    return 8 if mix.others else 3


@dataclass
class HeadOut:
    """What the head gives for N slots: `total` (sum w * (ce_weight * CE + kl_weight * KL), with
    grad), per slot `ce` (float32), `pred` (argmax); with a teacher, per slot `kl` (KL(p || q), the
    target's distribution p against the drafter's q), `accept` (sum over the vocabulary of min(p, q):
    the probability that speculative sampling at temperature 1 accepts the drafted token) and
    `draft_prob` (p of the drafter's argmax: what a greedy drafter, DraftDeck's and vLLM's, gets
    accepted by a target sampling at temperature 1) and `target_pred` (the target's argmax); `extra`,
    what a drafter's own heads add to each slot's loss. All but `total` are detached."""

    total: torch.Tensor
    ce: torch.Tensor
    pred: torch.Tensor
    kl: torch.Tensor | None = None
    accept: torch.Tensor | None = None
    target_pred: torch.Tensor | None = None
    draft_prob: torch.Tensor | None = None
    extra: torch.Tensor | None = None  # per slot, a drafter's own heads' loss (in `total` already)
    others: torch.Tensor | None = None  # per slot, the mix's terms beyond ce and kl (in `total` already)


def head_loss(
    head: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    *,
    teacher: torch.Tensor | None = None,
    mix: Mix | tuple[float, float] = (1.0, 0.0),
    chunked: bool = True,
    chunk_bytes: int = LOGITS_CHUNK_BYTES,
    low_rank: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> HeadOut:
    """The drafter's loss through the target's head for `hidden` (N, H): cross-entropy against
    `labels`, and with `teacher` (N, H: the target's final hidden states before each slot's token)
    the forward KL from the target's distribution and the mix's other terms, weighted by `mix` (a
    `Mix`, or the pair (ce_weight, kl_weight)).
    `low_rank` = (u, W2), (N, r) and (V, r): a drafter's own term added to its logits, u W2^T (DSpark's
    Markov bias), with gradients for both (the target's head has none).

    `head` is an `nn.Linear` (the chunked path: a chunk of logits alive at a time; with a teacher,
    three chunks of a third of the slots) or any module mapping (N, H) -> (N, V), which goes the
    unchunked way (as does `chunked=False`: the reference). Exact: no top-k, no temperature."""
    mix = as_mix(mix)
    ce_w, kl_w = mix.ce, mix.kl
    if mix.needs_teacher and teacher is None:
        names = ", ".join(n for n, _ in mix.terms if n != "ce")
        raise ValueError(f"a KL loss ({names}) needs the target's hidden states (teacher)")
    if isinstance(head, ShardedHead):  # a collective: every rank calls it, with or without rows
        if low_rank is not None:
            raise ValueError("a drafter's own logit term beside a head split by vocabulary is not supported")
        return _sharded_loss(head, hidden, labels, weights, teacher, mix, chunk_bytes)
    u, w2 = low_rank if low_rank is not None else (None, None)
    if chunked and isinstance(head, nn.Linear) and hidden.shape[0]:
        # with a teacher three (rows, V) tensors are alive at once: a third of the rows keeps the peak
        rows = rows_per_chunk(head.out_features, chunk_bytes // _alive(teacher, mix))
        if not torch.is_grad_enabled():  # the held-out walk: counts only
            out, _ = _chunked(
                hidden, head.weight, head.bias, labels, weights, rows, (False,) * 3, teacher, mix,
                low_rank=low_rank,
            )  # fmt: skip
            return out
        total, ce, pred, kl, accept, tpred, dprob, others = _ChunkedLinearLoss.apply(
            hidden, head.weight, head.bias, labels, weights, rows, teacher, mix, None, u, w2
        )
        return _out(total, ce, pred, kl, accept, tpred, dprob, others, teacher is not None, mix)
    logits = head(hidden).float()
    if u is not None and w2 is not None:
        logits = logits + F.linear(u.to(w2.dtype), w2).float()
    ce = F.cross_entropy(logits, labels, reduction="none")
    if teacher is None:
        return HeadOut((weights * ce_w * ce).sum(), ce.detach(), logits.argmax(-1))
    with torch.no_grad():
        t_logits = head(teacher).float()
        logp = F.log_softmax(t_logits, dim=-1)
    logq = F.log_softmax(logits, dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    accept = torch.minimum(logp.exp(), logq.exp()).sum(-1)
    total = (weights * (ce_w * ce + kl_w * kl)).sum()
    others = None
    if mix.others:  # the reference: each term in torch ops, autograd's gradient
        terms = torch.stack([w * term_value(n, logp, logq, mix.lk_eta) for n, w in mix.others]).sum(0)
        total = total + (weights * terms).sum()
        others = terms.detach()
    pred = logits.argmax(-1)
    draft_prob = logp.exp().gather(1, pred[:, None])[:, 0]
    return HeadOut(
        total, ce.detach(), pred, kl.detach(), accept.detach(), t_logits.argmax(-1), draft_prob, others=others
    )


def _out(
    total: torch.Tensor, ce: torch.Tensor, pred: torch.Tensor, kl: torch.Tensor, accept: torch.Tensor,
    tpred: torch.Tensor, dprob: torch.Tensor, others: torch.Tensor, with_teacher: bool, mix: Mix,
) -> HeadOut:  # fmt: skip
    """`_ChunkedLinearLoss`'s outputs as a `HeadOut` (its empty stand-ins as None)."""
    if not with_teacher:
        return HeadOut(total, ce, pred)
    return HeadOut(total, ce, pred, kl, accept, tpred, dprob, others=others if mix.others else None)


class _ChunkedLinearLoss(torch.autograd.Function):
    """Forward computes, chunk by chunk, the loss, its per-slot parts and its gradient with respect
    to the hidden states (and to the head's weight and bias when those require grad); the backward
    only scales them by the incoming gradient. The teacher is the frozen target's: no gradient."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        weights: torch.Tensor,
        rows: int,
        teacher: torch.Tensor | None,
        mix: Mix,
        sharded: ShardedHead | None = None,
        u: torch.Tensor | None = None,
        w2: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        grads = ctx.needs_input_grad
        need = (grads[0], grads[1], bias is not None and grads[2])
        low_rank = (u, w2) if u is not None and w2 is not None else None
        ctx.low_rank_dtypes = None if low_rank is None else (u.dtype, w2.dtype)  # type: ignore[union-attr]
        if sharded is not None:  # the frozen target's slice: no gradient for it
            out, ctx.grads = _over_shard(sharded, hidden, labels, weights, rows, grads[0], teacher, mix)
            ctx.low_rank_grads = (None, None)
        else:
            out, grads_all = _chunked(
                hidden, weight, bias, labels, weights, rows, need, teacher, mix,
                low_rank=low_rank, need_low_rank=(grads[9], grads[10]),
            )  # fmt: skip
            ctx.grads, ctx.low_rank_grads = grads_all[:3], grads_all[3:]
        parts = [out.ce, out.pred]
        if teacher is not None:
            assert out.kl is not None and out.accept is not None and out.target_pred is not None
            assert out.draft_prob is not None
            parts += [out.kl, out.accept, out.target_pred, out.draft_prob]
        else:  # autograd.Function outputs must be tensors: empty stand-ins
            parts += [out.ce.new_empty(0)] * 4
        parts.append(out.others if out.others is not None else out.ce.new_empty(0))
        ctx.mark_non_differentiable(*parts)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return (out.total, *parts)

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> Any:
        grad_h, grad_w, grad_b = ctx.grads  # freed with the graph
        grad_u, grad_w2 = ctx.low_rank_grads
        scale = grad_loss.float()
        return (
            None if grad_h is None else grad_h * scale.to(grad_h.dtype),
            None if grad_w is None else (grad_w * scale).to(ctx.dtypes[0]),
            None if grad_b is None else (grad_b * scale).to(ctx.dtypes[1]),
            None,
            None,
            None,
            None,
            None,
            None,
            None if grad_u is None else (grad_u * scale).to(ctx.low_rank_dtypes[0]),
            None if grad_w2 is None else (grad_w2 * scale).to(ctx.low_rank_dtypes[1]),
        )


def _chunked(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    weights: torch.Tensor,
    rows: int,
    need: tuple[bool, bool, bool],
    teacher: torch.Tensor | None = None,
    mix: Mix = Mix(),
    vocab: WholeVocab | None = None,
    *,
    low_rank: tuple[torch.Tensor, torch.Tensor] | None = None,
    need_low_rank: tuple[bool, bool] = (False, False),
) -> tuple[HeadOut, tuple[Any, ...]]:
    """The loss, its per-slot parts and the gradients `need` names (hidden, weight, bias), chunk by
    chunk, then those of `low_rank` = (u, W2) that `need_low_rank` names (its term u W2^T is added to
    the logits). The gradient of the loss with respect to the drafter's logits is, per slot,
    w * (ce_weight * (q - onehot(label)) + kl_weight * (q - p) + the other terms' (`_other_terms`)).
    With `vocab` a `VocabShard`, `weight` is its slice and the gradient with respect to `hidden` this
    slice's part."""
    vocab = vocab or WholeVocab()
    need_h, need_w, need_b = need
    ce_w, kl_w = mix.ce, mix.kl
    n = hidden.shape[0]
    dev = hidden.device
    others = torch.empty(n, dtype=torch.float32, device=dev) if mix.others and teacher is not None else None
    ce = torch.empty(n, dtype=torch.float32, device=dev)
    pred = torch.empty(n, dtype=torch.long, device=dev)
    kl = torch.empty(n, dtype=torch.float32, device=dev) if teacher is not None else None
    accept = torch.empty(n, dtype=torch.float32, device=dev) if teacher is not None else None
    tpred = torch.empty(n, dtype=torch.long, device=dev) if teacher is not None else None
    dprob = torch.empty(n, dtype=torch.float32, device=dev) if teacher is not None else None
    grad_h = torch.empty_like(hidden) if need_h else None
    grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
    grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b and bias is not None else None
    u, w2 = low_rank if low_rank is not None else (None, None)
    grad_u = torch.empty_like(u) if u is not None and need_low_rank[0] else None
    grad_w2 = torch.zeros_like(w2, dtype=torch.float32) if w2 is not None and need_low_rank[1] else None
    need_any = need_h or need_w or need_b or grad_u is not None or grad_w2 is not None
    logp_kept = logq = other_g = None
    with torch.no_grad():
        for s in range(0, n, rows):
            h = hidden[s : s + rows]
            logits = F.linear(h, weight, bias).float()
            if u is not None and w2 is not None:  # a drafter's own term (DSpark's Markov bias)
                logits += F.linear(u[s : s + rows].to(w2.dtype), w2).float()
            lab = labels[s : s + rows]
            lse = vocab.lse(logits)
            ce[s : s + rows] = lse - vocab.pick(logits, lab)
            pred[s : s + rows] = vocab.argmax(logits)
            p = None
            if teacher is not None:
                assert kl is not None and accept is not None and tpred is not None
                logp = F.linear(teacher[s : s + rows], weight, bias).float()
                tpred[s : s + rows] = vocab.argmax(logp)
                logp.sub_(vocab.lse(logp)[:, None])
                p = logp.exp()
                assert dprob is not None
                dprob[s : s + rows] = vocab.pick(p, pred[s : s + rows])
                if others is not None:
                    logp_kept = logp.clone()
                # KL(p || q) = sum p (log p - logits) + lse: one row dot product (no more chunks)
                kl[s : s + rows] = vocab.sum(_rowdot(p, logp.sub_(logits))) + lse
                del logp
            if p is None and not need_any:
                continue
            logits.sub_(lse[:, None])  # log q
            if others is not None:
                logq = logits.clone()
            q = logits.exp_()  # the softmax q, in place of the logits
            if p is not None:
                assert accept is not None
                accept[s : s + rows] = vocab.sum(torch.minimum(p, q).sum(-1))
            if others is not None:
                assert p is not None and logp_kept is not None and logq is not None
                assert kl is not None and accept is not None
                parts = (p, logp_kept, q, logq, kl[s : s + rows], accept[s : s + rows])
                others[s : s + rows], other_g = _other_terms(mix, *parts, vocab, need_any)
                logp_kept = logq = None
            if not need_any:
                continue
            g = q
            if ce_w + kl_w != 1.0:
                g.mul_(ce_w + kl_w)
            if ce_w:
                vocab.sub_at(g, lab, ce_w)
            if p is not None and kl_w:
                g.sub_(p, alpha=kl_w)
            if other_g is not None:
                g.add_(other_g)
                other_g = None
            g.mul_(weights[s : s + rows, None].float())
            if grad_h is not None:
                grad_h[s : s + rows] = (g.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_w is not None:
                grad_w += g.t() @ h.float()
            if grad_b is not None:
                grad_b += g.sum(0)
            if grad_u is not None and w2 is not None:
                grad_u[s : s + rows] = (g.to(w2.dtype) @ w2).to(grad_u.dtype)
            if grad_w2 is not None and u is not None:
                grad_w2 += g.t() @ u[s : s + rows].float()
        per_slot = ce_w * ce if kl is None else ce_w * ce + kl_w * kl
        if others is not None:
            per_slot = per_slot + others
        total = (weights.float() * per_slot).sum()
    out = HeadOut(total, ce, pred, kl, accept, tpred, dprob, others=others)
    return out, (grad_h, grad_w, grad_b, grad_u, grad_w2)


def _other_terms(
    mix: Mix,
    p: torch.Tensor,
    logp: torch.Tensor,
    q: torch.Tensor,
    logq: torch.Tensor,
    kl: torch.Tensor,
    alpha: torch.Tensor,
    vocab: WholeVocab,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """For a chunk's rows: the weighted sum of the mix's terms beyond ce and kl, per row, and (with
    `need_grad`) its gradient with respect to the drafter's logits, unweighted by the slots' weights.
    `kl` and `alpha` (sum min(p, q)) are the rows' own, summed over the vocabulary already. A term
    whose gradient with respect to q is g has q * (g - sum q g) with respect to the logits."""
    value = torch.zeros_like(kl)
    grad = torch.zeros_like(q) if need_grad else None
    tv_grad = None
    if need_grad and any(n in ("tv", "nla", "lk_hybrid") for n, _ in mix.others):
        # d(1 - sum min(p, q))/dq = -[q < p] (half on a tie, as torch.minimum's gradient)
        below = (q < p).float().add_((q == p).float(), alpha=0.5)
        tv_grad = (vocab.sum(_rowdot(q, below))[:, None] - below).mul_(q)
        del below
    for name, w in mix.others:
        if name == "rkl":  # KL(q || p): g = log q - log p
            d = logq - logp
            v = vocab.sum(_rowdot(q, d))
            if grad is not None:
                grad.add_(d.sub_(v[:, None]).mul_(q), alpha=w)
        elif name == "jsd":  # g = (log q - log m) / 2
            logm = torch.logaddexp(logp, logq).sub_(math.log(2.0))
            half_q = vocab.sum(_rowdot(q, logq - logm)) * 0.5
            v = vocab.sum(_rowdot(p, logp - logm)) * 0.5 + half_q
            if grad is not None:
                grad.add_(logm.sub_(logq).mul_(-0.5).sub_(half_q[:, None]).mul_(q), alpha=w)
        elif name == "tv":
            v = 1.0 - alpha
            if grad is not None:
                assert tv_grad is not None
                grad.add_(tv_grad, alpha=w)
        elif name == "nla":  # -log alpha: the TV's gradient over alpha
            v = -torch.log(alpha)
            if grad is not None:
                assert tv_grad is not None
                grad.add_(tv_grad * (w / alpha)[:, None])
        elif name == "lk_hybrid":  # lambda is a constant (sg[alpha]): lambda (q - p) + (1 - lambda) TV's
            lam = torch.exp(-mix.lk_eta * alpha)
            v = lam * kl + (1.0 - lam) * (1.0 - alpha)
            if grad is not None:
                assert tv_grad is not None
                # one temporary at a time: the chunk's count of (rows, V) tensors (`_alive`) holds
                grad.add_((q - p).mul_(lam[:, None]), alpha=w)
                grad.add_(tv_grad * ((1.0 - lam) * w)[:, None])
        else:
            raise ValueError(f"{name!r} is not a loss term the head computes")
        value += w * v
    return value, grad


def _sharded_loss(
    head: ShardedHead,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    teacher: torch.Tensor | None,
    mix: Mix,
    chunk_bytes: int,
) -> HeadOut:
    rows = rows_per_chunk(head.shard.size, chunk_bytes // _alive(teacher, mix))
    if not torch.is_grad_enabled():
        return _over_shard(head, hidden, labels, weights, rows, False, teacher, mix)[0]
    total, ce, pred, kl, accept, tpred, dprob, others = _ChunkedLinearLoss.apply(
        hidden, head.weight, None, labels, weights, rows, teacher, mix, head
    )
    return _out(total, ce, pred, kl, accept, tpred, dprob, others, teacher is not None, mix)


def _over_shard(
    head: ShardedHead,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    rows: int,
    need_h: bool,
    teacher: torch.Tensor | None,
    mix: Mix,
) -> tuple[HeadOut, tuple[Any, Any, Any]]:
    """`_chunked` over a vocabulary slice: every rank's rows (gathered unless the ranks hold the
    same), then this rank's rows of each result, and of the gradient summed over the slices."""
    shard, n = head.shard, hidden.shape[0]
    every, m = shard.gather_rows(hidden)
    labels_all = shard.gather_rows(labels)[0]
    weights_all = shard.gather_rows(weights)[0]  # padding rows weigh 0: no loss, no gradient
    teacher_all = None if teacher is None else shard.gather_rows(teacher)[0]
    out, (grad_h, *_) = _chunked(
        every,
        head.weight,
        None,
        labels_all,
        weights_all,
        rows,
        (need_h, False, False),
        teacher_all,
        mix,
        shard,
    )

    def own(x: torch.Tensor | None) -> Any:
        return None if x is None else shard.own_rows(x, m, n)

    ce, kl, others = own(out.ce), own(out.kl), own(out.others)
    per_slot = mix.ce * ce if kl is None else mix.ce * ce + mix.kl * kl
    if others is not None:
        per_slot = per_slot + others
    total = (weights.float() * per_slot).sum()
    mine = HeadOut(
        total,
        ce,
        own(out.pred),
        kl,
        own(out.accept),
        own(out.target_pred),
        own(out.draft_prob),
        others=others,
    )
    return mine, (None if grad_h is None else shard.sum_rows(grad_h, m, n), None, None)


def head_argmax(head: nn.Module, hidden: torch.Tensor, chunk_bytes: int = LOGITS_CHUNK_BYTES) -> torch.Tensor:
    """(N,) the head's argmax for `hidden` (N, H), a chunk of logits alive at a time (as `head_loss`
    computes its `pred`)."""
    if isinstance(head, ShardedHead):  # a collective
        shard = head.shard
        every, m = shard.gather_rows(hidden)
        rows = rows_per_chunk(shard.size, chunk_bytes)
        pred = torch.empty(every.shape[0], dtype=torch.long, device=hidden.device)
        for s in range(0, every.shape[0], rows):
            pred[s : s + rows] = shard.argmax(F.linear(every[s : s + rows], head.weight).float())
        return shard.own_rows(pred, m, hidden.shape[0])
    vocab = head.out_features if isinstance(head, nn.Linear) else None
    rows = rows_per_chunk(vocab, chunk_bytes) if vocab else max(1, hidden.shape[0])
    out = torch.empty(hidden.shape[0], dtype=torch.long, device=hidden.device)
    for s in range(0, hidden.shape[0], rows):
        out[s : s + rows] = head(hidden[s : s + rows]).argmax(-1)
    return out


def head_topk(
    head: nn.Module, hidden: torch.Tensor, k: int, chunk_bytes: int = LOGITS_CHUNK_BYTES
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, k) the head's k largest logits for `hidden` (N, H) and their ids, a chunk of logits alive at
    a time (DFlash2's candidates, which its selector reranks)."""
    if isinstance(head, ShardedHead):
        raise ValueError("top-k candidates over a head split by vocabulary are not supported")
    vocab = head.out_features if isinstance(head, nn.Linear) else None
    rows = rows_per_chunk(vocab, chunk_bytes) if vocab else max(1, hidden.shape[0])
    values = torch.empty(hidden.shape[0], k, dtype=torch.float32, device=hidden.device)
    ids = torch.empty(hidden.shape[0], k, dtype=torch.long, device=hidden.device)
    for s in range(0, hidden.shape[0], rows):
        top = head(hidden[s : s + rows]).float().topk(k, dim=-1)
        values[s : s + rows], ids[s : s + rows] = top.values, top.indices
    return values, ids


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N,) the dot product of each row of `a` and `b`, without an (N, V) product."""
    return torch.bmm(a[:, None, :], b[:, :, None])[:, 0, 0]
