"""Block-sparse attention for the flattened DFlash blocks of training and the held-out walk.

A query in block a (anchor p_a, B slots) sees context keys strictly before p_a (and not padding)
and the B keys of its own block, nothing else. With A blocks over T tokens the dense layout is
(A*B) x (T + A*B) keys, of which a query needs about p_a + B: at T = 4,096, A = 512, B = 16 that is
~2K of ~12K keys, and the block-block part is 8,192 x 8,192 for 16 useful keys per query.
`BlockLayout` describes the visibility once per batch; three backends compute the same attention:

- ``flex``: `torch.nn.attention.flex_attention` under a `create_block_mask` of the layout, compiled
  (the default where it runs: a CUDA device; PyTorch has no flex backward on the CPU).
- ``blocked``: the project's own block-sparse kernel in PyTorch ops (`BlockedAttention`), the
  default elsewhere: queries in chunks of anchors, each against the context prefix its anchors need
  (a view, never a copy) and its own blocks' keys, one softmax over both; the backward recomputes
  the chunk's scores from the saved log-sum-exp, FlashAttention's way, so memory holds one chunk of
  scores, never the (A*B) x (T + A*B) matrix.
- ``dense``: SDPA under the dense boolean mask: the reference the others are tested against.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.nn import functional as F

Backend = Literal["flex", "blocked", "dense"]
BACKEND_CHOICES = ("auto", "flex", "blocked", "dense")
SCORE_CHUNK_BYTES = 64 * 2**20  # the blocked kernel's score chunk: (bsz, heads, queries, keys) float32

log = logging.getLogger(__name__)


def flex_available(device: torch.device) -> bool:
    """Flex attention trains only where it has a backward: CUDA (not the CPU, as of PyTorch 2.13)."""
    if device.type != "cuda":
        return False
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(choice: str, device: torch.device) -> Backend:
    """`auto` -> flex where it trains, else blocked; a forced `flex` where it cannot is an error."""
    if choice == "auto":
        return "flex" if flex_available(device) else "blocked"
    if choice == "flex" and not flex_available(device):
        raise ValueError(
            f"attention 'flex' needs a CUDA device (PyTorch {torch.__version__} has no flex-attention "
            f"backward on {device.type}): use 'blocked' or 'auto'"
        )
    if choice not in ("flex", "blocked", "dense"):
        raise ValueError(f"attention {choice!r}: choose one of {', '.join(BACKEND_CHOICES)}")
    return choice  # type: ignore[return-value]


@dataclass
class BlockLayout:
    """Who sees whom: `anchors` (bsz, A) (padding anchors at 0: no context), `key_ok` (bsz, T) bool
    or None (False: a padded key), `context_len` T, `block_size` B, and the backend. Passed to the
    drafter as its `attention_mask`; every layer of one forward shares it (and its flex block mask)."""

    anchors: torch.Tensor
    key_ok: torch.Tensor | None
    context_len: int
    block_size: int
    backend: Backend = "blocked"
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def queries(self) -> int:
        return self.anchors.shape[1] * self.block_size

    def dense_mask(self) -> torch.Tensor:
        """(bsz, 1, A*B, T + A*B) bool, True = visible."""
        if "dense" not in self._cache:
            self._cache["dense"] = _dense_mask(self)
        mask: torch.Tensor = self._cache["dense"]
        return mask

    def attend(
        self,
        q: torch.Tensor,
        k_ctx: torch.Tensor,
        k_blk: torch.Tensor,
        v_ctx: torch.Tensor,
        v_blk: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """q (bsz, H, A*B, D); the context's keys and values (bsz, Hkv, T, D) and the blocks' (bsz,
        Hkv, A*B, D), apart (the context's are computed once for all the anchors of a batch)
        -> (bsz, H, A*B, D)."""
        gqa = q.shape[1] != k_ctx.shape[1]
        if self.backend == "blocked":
            out: torch.Tensor = BlockedAttention.apply(q, k_ctx, k_blk, v_ctx, v_blk, self, scale)
            return out
        k, v = torch.cat([k_ctx, k_blk], dim=2), torch.cat([v_ctx, v_blk], dim=2)
        if self.backend == "flex":
            return _flex(self, q, k, v, scale, gqa)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=self.dense_mask(), scale=scale, enable_gqa=gqa
        )


def _dense_mask(layout: BlockLayout) -> torch.Tensor:
    anchors, t, b = layout.anchors, layout.context_len, layout.block_size
    bsz, a = anchors.shape
    dev = anchors.device
    ctx_ok = torch.arange(t, device=dev)[None, None, :] < anchors[:, :, None]  # strictly before
    if layout.key_ok is not None:
        ctx_ok = ctx_ok & layout.key_ok[:, None, :]
    ctx_ok = ctx_ok[:, :, None, :].expand(bsz, a, b, t).reshape(bsz, a * b, t)
    blk = torch.arange(a, device=dev).repeat_interleave(b)
    same_block = (blk[:, None] == blk[None, :]).expand(bsz, a * b, a * b)
    return torch.cat([ctx_ok, same_block], dim=2)[:, None]


# --- flex ---------------------------------------------------------------------------------------
_COMPILED: dict[str, Any] = {}


def flex_rule(layout: BlockLayout) -> Any:
    """The layout's visibility as a flex-attention mask_mod: (batch, head, query, key) -> visible."""
    anchors, key_ok, t, b = layout.anchors, layout.key_ok, layout.context_len, layout.block_size

    def visible(bi: Any, hi: Any, qi: Any, kv: Any) -> Any:
        blk = qi // b
        ctx = (kv < t) & (kv < anchors[bi, blk])
        if key_ok is not None:
            ctx = ctx & key_ok[bi, kv.clamp(max=t - 1)]
        return ctx | ((kv >= t) & ((kv - t) // b == blk))

    return visible


def _flex(
    layout: BlockLayout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, gqa: bool
) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "flex" not in layout._cache:
        bsz, q_len = layout.anchors.shape[0], layout.queries
        layout._cache["flex"] = create_block_mask(
            flex_rule(layout), bsz, None, q_len, layout.context_len + q_len, device=q.device
        )
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(flex_attention, dynamic=True)
        log.info("flex attention compiled for the drafter's blocks")
    return _COMPILED["fn"](q, k, v, block_mask=layout._cache["flex"], scale=scale, enable_gqa=gqa)


# --- blocked ------------------------------------------------------------------------------------
def _chunks(layout: BlockLayout, heads: int) -> list[tuple[int, int, int]]:
    """(first anchor, anchors, context keys) per chunk: as many anchors as keep one chunk's scores
    under SCORE_CHUNK_BYTES, the context cut at the chunk's largest anchor."""
    bsz, a = layout.anchors.shape
    b, t = layout.block_size, layout.context_len
    per_anchor = bsz * heads * b * max(t, b) * 4
    step = max(1, SCORE_CHUNK_BYTES // per_anchor)
    ends = layout.anchors.max(dim=0).values.cpu().tolist() if a else []
    out = []
    for s in range(0, a, step):
        n = min(step, a - s)
        out.append((s, n, int(min(max(ends[s : s + n]), t))))
    return out


def _mask_context_(scores: torch.Tensor, layout: BlockLayout, s: int, n: int, keys: int, fill: float) -> None:
    """Fill, in place, the context scores (bsz, Hkv, G, n*B, keys) a chunk's queries may not see.

    Keys before the chunk's smallest anchor are visible to all its queries (unless padded), so only
    the columns from there on are masked: a few anchors' worth, not the whole prefix."""
    anchors = layout.anchors[:, s : s + n]
    key_ok = layout.key_ok
    padded = key_ok is not None and not bool(key_ok[:, :keys].all())
    lo = 0 if padded else int(anchors.min())
    if lo >= keys:
        return
    cols = torch.arange(lo, keys, device=anchors.device)
    ok = cols[None, None, :] < anchors[:, :, None]  # (bsz, n, keys - lo): strictly before the anchor
    if padded and key_ok is not None:
        ok = ok & key_ok[:, None, lo:keys]
    b = layout.block_size
    ok = ok[:, :, None, :].expand(-1, n, b, keys - lo).reshape(ok.shape[0], 1, 1, n * b, keys - lo)
    scores[..., lo:keys].masked_fill_(~ok, fill)


class BlockedAttention(torch.autograd.Function):
    """Block-sparse attention over a `BlockLayout`, FlashAttention-style at chunk granularity.

    Saves the inputs, the output and the per-query log-sum-exp; the backward recomputes each
    chunk's scores. All softmax arithmetic is float32 whatever the inputs' dtype."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k_ctx: torch.Tensor,
        k_blk: torch.Tensor,
        v_ctx: torch.Tensor,
        v_blk: torch.Tensor,
        layout: BlockLayout,
        scale: float,
    ) -> torch.Tensor:
        kv = KV(k_ctx, k_blk, v_ctx, v_blk)
        out, lse = _blocked_forward(q, kv, layout, scale)
        ctx.save_for_backward(q, k_ctx, k_blk, v_ctx, v_blk, out, lse)
        ctx.layout, ctx.scale = layout, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        q, k_ctx, k_blk, v_ctx, v_blk, out, lse = ctx.saved_tensors
        kv = KV(k_ctx, k_blk, v_ctx, v_blk)
        dq, dkc, dkb, dvc, dvb = _blocked_backward(q, kv, out, lse, grad_out, ctx.layout, ctx.scale)
        return dq, dkc, dkb, dvc, dvb, None, None


@dataclass
class KV:
    """The context's keys and values (bsz, Hkv, T, D) and the blocks' (bsz, Hkv, A*B, D)."""

    k_ctx: torch.Tensor
    k_blk: torch.Tensor
    v_ctx: torch.Tensor
    v_blk: torch.Tensor


def _scores(qc: torch.Tensor, kc: torch.Tensor) -> torch.Tensor:
    """Scores in float32 (q comes pre-scaled)."""
    return torch.matmul(qc, kc.transpose(-1, -2)).float()


def _parts(q: torch.Tensor, kv: KV, layout: BlockLayout, s: int, n: int, keys: int) -> Any:
    """The chunk's queries (bsz, Hkv, G, n, B, D) and its keys/values: the context prefix (views)
    and its own blocks (bsz, Hkv, 1, n, B, D)."""
    b = layout.block_size
    bsz, kvh, _, d = kv.k_ctx.shape
    q6 = q[:, :, s * b : (s + n) * b].reshape(bsz, kvh, q.shape[1] // kvh, n, b, d)
    kb = kv.k_blk[:, :, s * b : (s + n) * b].reshape(bsz, kvh, 1, n, b, d)
    vb = kv.v_blk[:, :, s * b : (s + n) * b].reshape(bsz, kvh, 1, n, b, d)
    return q6, kv.k_ctx[:, :, :keys], kv.v_ctx[:, :, :keys], kb, vb


def _blocked_forward(
    q: torch.Tensor, kv: KV, layout: BlockLayout, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    bsz, h, q_len, d = q.shape
    kvh, g = kv.k_ctx.shape[1], h // kv.k_ctx.shape[1]
    v = kv.v_ctx
    out = torch.empty_like(q)
    lse = torch.empty(bsz, h, q_len, dtype=torch.float32, device=q.device)
    b = layout.block_size
    qs = q * scale
    for s, n, keys in _chunks(layout, h):
        q6, kc, vc, kb, vb = _parts(qs, kv, layout, s, n, keys)
        s_blk = _scores(q6, kb)  # (bsz, Hkv, G, n, B, B)
        m = s_blk.amax(-1)  # (bsz, Hkv, G, n, B): the own block is never empty
        if keys:
            s_ctx = _scores(q6.reshape(bsz, kvh, g * n * b, d), kc).view(bsz, kvh, g, n * b, keys)
            _mask_context_(s_ctx, layout, s, n, keys, float("-inf"))
            m = torch.maximum(m, s_ctx.amax(-1).view_as(m))
        p_blk = torch.exp(s_blk.sub_(m[..., None]))
        denom = p_blk.sum(-1)
        acc = torch.matmul(p_blk.to(v.dtype), vb).float()  # (bsz, Hkv, G, n, B, D)
        if keys:
            p_ctx = s_ctx.sub_(m.view(bsz, kvh, g, n * b, 1)).exp_()
            denom = denom + p_ctx.sum(-1).view_as(denom)
            acc = acc + torch.matmul(p_ctx.to(v.dtype), vc[:, :, None]).float().view_as(acc)
        o = (acc / denom[..., None]).to(q.dtype)
        out[:, :, s * b : (s + n) * b] = o.reshape(bsz, h, n * b, d)
        lse[:, :, s * b : (s + n) * b] = (m + denom.log()).reshape(bsz, h, n * b)
    return out, lse


def _blocked_backward(
    q: torch.Tensor,
    kv: KV,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    layout: BlockLayout,
    scale: float,
) -> tuple[torch.Tensor, ...]:
    """dS = P * (dP - rowsum(dO * O)); dQ = scale * dS K, dK = scale * dS^T Q, dV = P^T dO."""
    bsz, h, _, d = q.shape
    kvh, g = kv.k_ctx.shape[1], h // kv.k_ctx.shape[1]
    b = layout.block_size
    dq = torch.empty_like(q, dtype=torch.float32)
    dkc = torch.zeros_like(kv.k_ctx, dtype=torch.float32)
    dvc = torch.zeros_like(kv.v_ctx, dtype=torch.float32)
    dkb = torch.empty_like(kv.k_blk, dtype=torch.float32)  # every block's slots: written once
    dvb = torch.empty_like(kv.v_blk, dtype=torch.float32)
    delta = (grad_out.float() * out.float()).sum(-1)  # (bsz, H, Q)
    qs = q * scale
    for s, n, keys in _chunks(layout, h):
        q6, kc, vc, kb, vb = _parts(qs, kv, layout, s, n, keys)
        sl = slice(s * b, (s + n) * b)
        do6 = grad_out[:, :, sl].reshape(bsz, kvh, g, n, b, d).float()
        lse6 = lse[:, :, sl].reshape(bsz, kvh, g, n, b, 1)
        dl6 = delta[:, :, sl].reshape(bsz, kvh, g, n, b, 1)
        # the chunk's own blocks
        p_blk = _scores(q6, kb).sub_(lse6).exp_()
        ds_blk = torch.matmul(do6, vb.float().transpose(-1, -2)).sub_(dl6).mul_(p_blk)
        dq_c = torch.matmul(ds_blk, kb.float())  # (bsz, Hkv, G, n, B, D)
        dk_own = torch.matmul(ds_blk.transpose(-1, -2), q6.float()).sum(2)  # (bsz, Hkv, n, B, D)
        dv_own = torch.matmul(p_blk.transpose(-1, -2), do6).sum(2)
        dkb[:, :, sl] = dk_own.reshape(bsz, kvh, n * b, d)
        dvb[:, :, sl] = dv_own.reshape(bsz, kvh, n * b, d)
        if keys:  # the context prefix
            qf = q6.reshape(bsz, kvh, g * n * b, d)
            p = _scores(qf, kc).sub_(lse6.reshape(bsz, kvh, g * n * b, 1)).exp_()
            _mask_context_(p.view(bsz, kvh, g, n * b, keys), layout, s, n, keys, 0.0)
            dof = do6.reshape(bsz, kvh, g * n * b, d)
            ds = torch.matmul(dof, vc.float().transpose(-1, -2)).sub_(dl6.reshape(bsz, kvh, -1, 1)).mul_(p)
            dq_c += torch.matmul(ds, kc.float()).view_as(dq_c)
            dkc[:, :, :keys] += torch.matmul(ds.transpose(-1, -2), qf.float())
            dvc[:, :, :keys] += torch.matmul(p.transpose(-1, -2), dof)
        dq[:, :, sl] = dq_c.reshape(bsz, h, n * b, d) * scale
    # dK was accumulated against the scaled queries: scale * dS^T Q already
    dt = kv.k_ctx.dtype
    return dq.to(q.dtype), dkc.to(dt), dkb.to(dt), dvc.to(dt), dvb.to(dt)
