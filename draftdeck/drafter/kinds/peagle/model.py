"""`PEagleDrafter`: P-EAGLE's draft model (parallel EAGLE; speculators' `PEagleDraftModel`, which vLLM
serves as EAGLE-3 with `parallel_drafting`).

It is EAGLE-3's drafter (`draftdeck.drafter.kinds.eagle3.model`: the same `fc` over three tapped target
layers, the one decoder layer, the norms, the head over a draft vocabulary with `d2t`/`t2d`), drafting
all K positions of a verify step in one forward instead of K sequential steps. Position t of a row holds
the pair (the target's tapped states at t, the token x[t + 1]); the chain drafted from anchor t has K
depths: depth 0 is that pair, depth d >= 1 takes the learned `mask_hidden` (3 Ht wide, before `fc`) and
the mask token's embedding, sits at rope position t + d and predicts x[t + d + 2].

The causal structure is speculators' (`create_peagle_mask_mod`): an element (t, d) sees every depth-0
key at s <= t and its own chain's keys at depths 1..d; at inference that is plain causal attention over
[committed pairs ; K - 1 masks] (`PEagleSource`). With one layer, depth d's keys depend on its inputs
alone, so a chain's depths need not be computed in order: training computes only the depths COD
sampling keeps (`parallel` over each depth's anchors), the held-out walk all of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from draftdeck.drafter.kinds.eagle3.model import AUX_LAYERS, QUERY_CHUNK, Eagle3Config, Eagle3Drafter, ahead
from draftdeck.drafter.model.config import DrafterConfigError


@dataclass(frozen=True)
class PEagleConfig(Eagle3Config):
    """EAGLE-3's shape, the mask token the parallel positions read and the depths (K) a forward drafts."""

    mask_token_id: int = 0
    num_depths: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DrafterConfigError(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary of {self.vocab_size}"
            )
        if self.num_depths < 1:
            raise DrafterConfigError(f"num_depths {self.num_depths}: a chain drafts at least one token")

    @classmethod
    def of_target(
        cls, target_config: Any, *, draft_vocab_size: int, aux_layer_ids: list[int] | None,
        mask_token_id: int, num_depths: int,
    ) -> PEagleConfig:  # fmt: skip
        """EAGLE-3's shape for `target_config` (`Eagle3Config.from_target`), with the mask and depths."""
        base = Eagle3Config.from_target(
            target_config, draft_vocab_size=draft_vocab_size, aux_layer_ids=aux_layer_ids
        )
        return cls(**asdict(base), mask_token_id=mask_token_id, num_depths=num_depths)


KV = tuple[torch.Tensor, torch.Tensor]  # one depth's keys and values, (bsz, Hkv, n, D) each


def chain_attention(
    q: torch.Tensor,
    anchors: torch.Tensor,
    base: KV,
    chain: list[KV],
    key_ok: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """Depth d's attention (d = len(chain)): queries q (bsz, H, n, D) of the chains at `anchors` (bsz, n)
    against depth 0's keys (bsz, Hkv, T, D) at positions <= the anchor (and `key_ok` (bsz, T) where
    given), and their own chain's keys at depths 1..d (each (bsz, Hkv, n, D), aligned with q). Returns
    (bsz, H, n, D), in chunks of `QUERY_CHUNK` queries."""
    heads, t = q.shape[1], base[0].shape[2]
    group = heads // base[0].shape[1]

    def kv(x: torch.Tensor) -> torch.Tensor:  # grouped-query attention: each kv head serves `group`
        return x.repeat_interleave(group, dim=1) if group > 1 else x

    k0, v0 = kv(base[0]), kv(base[1])
    own_k, own_v = [kv(k) for k, _ in chain], [kv(v) for _, v in chain]
    keys = torch.arange(t, device=q.device)
    out = torch.empty_like(q)
    for s in range(0, q.shape[2], QUERY_CHUNK):
        e = min(q.shape[2], s + QUERY_CHUNK)
        qc = q[:, :, s:e]
        scores = (qc @ k0.transpose(-1, -2)).float() * scaling  # (bsz, H, c, T)
        visible = keys[None, None, :] <= anchors[:, s:e, None]  # (bsz, c, T)
        if key_ok is not None:
            visible = visible & key_ok[:, None, :]
        scores = scores.masked_fill(~visible[:, None], float("-inf"))
        own = [((qc * k[:, :, s:e]).sum(-1).float() * scaling)[..., None] for k in own_k]
        probs = torch.softmax(torch.cat([scores, *own], dim=-1), dim=-1).to(q.dtype)
        part = probs[..., :t] @ v0
        for j, v in enumerate(own_v):
            part = part + probs[..., t + j : t + j + 1] * v[:, :, s:e]
        out[:, :, s:e] = part
    return out


class PEagleDrafter(Eagle3Drafter):
    """P-EAGLE's drafter (module doc): EAGLE-3's state dict plus `mask_hidden` (1, 1, 3 Ht)."""

    config: PEagleConfig

    def __init__(self, config: PEagleConfig, *, initializer_range: float = 0.02):
        super().__init__(config, initializer_range=initializer_range)
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, AUX_LAYERS * config.target_hidden_size))

    def mask_inputs(self) -> torch.Tensor:
        """The hidden state every parallel position takes: `fc(mask_hidden)`, (H,)."""
        return self.fc(self.mask_hidden)[0, 0]

    def parallel(
        self,
        aux: torch.Tensor,
        embeds: torch.Tensor,
        mask_embed: torch.Tensor,
        anchors: list[torch.Tensor],
        attention_mask: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Each depth's pre-norm hidden states (bsz, n_d, H) at its chains' `anchors[d]` (bsz, n_d):
        `aux` (bsz, T, 3 Ht) the tapped target states, `embeds` (bsz, T, H) the target's embedding of
        x[0..T), `mask_embed` (H,) the mask token's. Depth 0 is every position (`anchors[0]` each row's
        0..T-1); a chain kept at depth d is kept at every depth below (COD sampling keeps them so).
        An anchor of T or more pads a row (its output is garbage, never read)."""
        layer = self.midlayer
        bsz, t, width = embeds.shape
        key_ok = None if attention_mask is None else attention_mask.bool()
        mask_hidden = self.mask_inputs()
        base: KV | None = None
        chain_kv: list[KV] = []  # depth j's keys and values, in its own anchors' order
        where: list[torch.Tensor] = []  # depth j's index of each anchor (bsz, T + 1); T: padding
        out = []
        for d, pos in enumerate(anchors):
            n = pos.shape[1]
            at = pos.clamp(max=t - 1)
            if d == 0:
                emb, hidden = ahead(embeds, 1), self.fc(aux)
            else:
                emb = mask_embed.to(embeds.dtype).expand(bsz, n, width)
                hidden = mask_hidden.to(embeds.dtype).expand(bsz, n, width)
            rope = self.rotary_emb(emb, at + d)
            mine = [
                (torch.gather(k, 2, idx), torch.gather(v, 2, idx))
                for (k, v), w in zip(chain_kv, where[1:], strict=True)
                for idx in [w.gather(1, at)[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])]
            ]

            def attend(
                q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d: int = d, at: torch.Tensor = at,
                mine: list[KV] = mine,
            ) -> torch.Tensor:  # fmt: skip
                nonlocal base
                if d == 0:
                    base = (k, v)
                else:
                    chain_kv.append((k, v))
                assert base is not None
                own = mine + ([(k, v)] if d else [])
                return chain_attention(q, at, base, own, key_ok, layer.self_attn.scaling)

            out.append(layer.run(emb, hidden, rope, attend))
            index = torch.full((bsz, t + 1), 0, dtype=torch.long, device=pos.device)
            index.scatter_(1, pos.clamp(max=t), torch.arange(n, device=pos.device).expand(bsz, n))
            where.append(index)
        return out


def dense_anchors(bsz: int, t: int, depths: int, device: torch.device) -> list[torch.Tensor]:
    """Every chain at every depth: anchors 0..T-1 at each of `depths` (the held-out walk's)."""
    return [torch.arange(t, device=device).expand(bsz, t) for _ in range(depths)]


def depth_labels(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, depth: int, kept: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels, counted), both (bsz, n): the element at anchor t of depth d predicts x[t + d + 2],
    counted where it is `kept`, that position exists and its loss mask is 1 (EAGLE-3's `ttt_labels`)."""
    t = input_ids.shape[1]
    at = anchors + depth + 2
    inside = kept & (at < t)
    safe = at.clamp(max=t - 1)
    labels = input_ids.gather(1, safe)
    return labels, inside & loss_mask.gather(1, safe).bool()
