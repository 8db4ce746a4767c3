"""The weighted cross-entropy through the target's LM head, without the logits wall.

The drafter's counted slots go through the target's frozen head: with Qwen3.6's 248K vocabulary
and 512 anchors x 15 slots the float32 logits are ~7.6 GB per sequence, and autograd keeps them
(and their gradient) for the backward. `head_ce` computes the loss, its gradient, the argmax and
each slot's CE in chunks of slots (`LOGITS_CHUNK_BYTES` of float32 logits at a time) and keeps
only the gradient with respect to the hidden states, (N, H): the same two matmuls per slot as the
unchunked path (logits, then dlogits @ W), one chunk of logits alive at a time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

LOGITS_CHUNK_BYTES = 64 * 2**20  # 64 MiB of float32 logits: 256 slots of a 64K vocabulary


def rows_per_chunk(vocab: int, chunk_bytes: int = LOGITS_CHUNK_BYTES) -> int:
    return max(1, chunk_bytes // (4 * max(vocab, 1)))


def head_ce(
    head: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    *,
    chunked: bool = True,
    chunk_bytes: int = LOGITS_CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum w * CE with grad, CE per row (float32, detached), argmax per row) for `hidden` (N, H).

    `head` is an `nn.Linear` (the chunked path) or any module mapping (N, H) -> (N, V), which goes
    the unchunked way (as does `chunked=False`: the reference)."""
    if chunked and isinstance(head, nn.Linear) and hidden.shape[0]:
        rows = rows_per_chunk(head.out_features, chunk_bytes)
        if not torch.is_grad_enabled():  # the held-out walk: counts only
            total, ce, pred, _ = _chunked(hidden, head.weight, head.bias, labels, weights, rows, (False,) * 3)
            return total, ce, pred
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = _ChunkedLinearCE.apply(
            hidden, head.weight, head.bias, labels, weights, rows
        )
        return out
    logits = head(hidden).float()
    ce = F.cross_entropy(logits, labels, reduction="none")
    return (weights * ce).sum(), ce.detach(), logits.argmax(-1)


class _ChunkedLinearCE(torch.autograd.Function):
    """Forward computes, chunk by chunk, CE, argmax and the gradient of sum w * CE with respect to
    the hidden states (and to the head's weight and bias when those require grad); the backward
    only scales them by the incoming gradient."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        weights: torch.Tensor,
        rows: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        grads = ctx.needs_input_grad
        need = (grads[0], grads[1], bias is not None and grads[2])
        total, ce, pred, ctx.grads = _chunked(hidden, weight, bias, labels, weights, rows, need)
        ctx.mark_non_differentiable(ce, pred)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total, ce, pred

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> Any:  # type: ignore[override]
        grad_h, grad_w, grad_b = ctx.grads  # freed with the graph
        scale = grad_loss.float()
        return (
            None if grad_h is None else grad_h * scale.to(grad_h.dtype),
            None if grad_w is None else (grad_w * scale).to(ctx.dtypes[0]),
            None if grad_b is None else (grad_b * scale).to(ctx.dtypes[1]),
            None,
            None,
            None,
        )


def _chunked(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    weights: torch.Tensor,
    rows: int,
    need: tuple[bool, bool, bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[Any, Any, Any]]:
    """sum w * CE, CE, argmax and the gradients `need` names (hidden, weight, bias), chunk by chunk."""
    need_h, need_w, need_b = need
    n = hidden.shape[0]
    ce = torch.empty(n, dtype=torch.float32, device=hidden.device)
    pred = torch.empty(n, dtype=torch.long, device=hidden.device)
    grad_h = torch.empty_like(hidden) if need_h else None
    grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
    grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b and bias is not None else None
    with torch.no_grad():
        for s in range(0, n, rows):
            h = hidden[s : s + rows]
            logits = F.linear(h, weight, bias).float()
            lab = labels[s : s + rows]
            lse = torch.logsumexp(logits, dim=-1)
            ce[s : s + rows] = lse - logits.gather(1, lab[:, None])[:, 0]
            pred[s : s + rows] = logits.argmax(-1)
            if not (need_h or need_w or need_b):
                continue
            g = logits.sub_(lse[:, None]).exp_()  # the softmax, in place of the logits
            g[torch.arange(g.shape[0], device=g.device), lab] -= 1.0
            g.mul_(weights[s : s + rows, None].float())
            if grad_h is not None:
                grad_h[s : s + rows] = (g.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_w is not None:
                grad_w += g.t() @ h.float()
            if grad_b is not None:
                grad_b += g.sum(0)
        total = (weights.float() * ce).sum()
    return total, ce, pred, (grad_h, grad_w, grad_b)
