"""`Eagle3Drafter`: EAGLE-3's draft model, and its training-time-test (TTT) forward.

Architecture (vLLM's `Eagle3LlamaForCausalLM`, SGLang's `LlamaForCausalLMEagle3`, speculators'
`Eagle3DraftModel`; the shared brief's section 1):

- the target's hidden states at three layers (low, middle, high), concatenated, (bsz, T, 3 Ht),
  -> `fc` (bias-free) -> g (bsz, T, H);
- one decoder layer (`midlayer`, Llama-style: no q/k norm): the token's embedding (the target's,
  frozen) through `input_layernorm` and g through `hidden_norm`, concatenated to 2H, from which q, k
  and v project; the residual is g itself (un-normed); then the MLP; its output h (pre-norm) is what
  the next draft step takes as its hidden state;
- `norm`, then `lm_head` over the draft vocabulary of N ids: draft id i is target id i + d2t[i]
  (`t2d` marks the target ids that have a draft id).

Layer ids are HF `hidden_states` indices (`aux_layer_ids`): index j is the input of decoder layer j
(the output of layer j - 1), which is vLLM's and speculators' convention ("capture before layer j");
SGLang and SpecForge name the output of layer j - 1, one less. Export converts.

Training-time test (`ttt`): the drafter is unrolled `steps` times over a row. At step k, position t
takes the token x[t + k + 1] and the hidden state g[t] (k = 0) or its own step k - 1 output at t,
sits at rope position t + k, and predicts x[t + k + 2]. Its query attends to the step-0 keys at
positions <= t (causal) and to the keys of steps 1..k at the same t (the diagonal): exactly what a
chain of k drafts after position t sees at inference, where draft j's key sits at position t + j.
The keys are kept per step (`ttt_attention`, EAGLE's and SpecForge's cache-list form; tested equal to
the dense mask over all steps that speculators builds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from draftdeck.drafter.model.config import FIXED_ROPE, DrafterConfigError, config_value, drafter_rope
from draftdeck.drafter.model.layers import MLP, RMSNorm, RotaryEmbedding, apply_rope

AUX_LAYERS = 3  # low, middle, high: vLLM's fc expects exactly 3 x the target's width
QUERY_CHUNK = 512  # step-0 attention in chunks of queries: a (chunk, T) score tile per head at a time


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """The three `hidden_states` indices the field taps: (2, L // 2, L - 3) as EAGLE, vLLM and
    speculators default them (Llama-3.1-8B: 2, 16, 29); a target under 8 layers: (1, L // 2, L - 1);
    a tiny one of 2 or 3 layers: its last three indices."""
    n = num_target_layers
    if n < 2:
        raise DrafterConfigError(f"EAGLE-3 taps three distinct layers: the target has {n} decoder layers")
    if n < 4:
        return [n - 2, n - 1, n]
    return [2, n // 2, n - 3] if n >= 8 else [1, n // 2, n - 1]


@dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE-3 drafter's shape: its layer's sizes default to the target's, `draft_vocab_size` is
    N, `aux_layer_ids` the three tapped `hidden_states` indices."""

    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_target_layers: int
    aux_layer_ids: tuple[int, ...]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    hidden_act: str = "silu"
    rope_parameters: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rope = {"rope_type": "default", **self.rope_parameters, "rope_theta": self.rope_theta}
        object.__setattr__(self, "rope_parameters", rope)
        if rope["rope_type"] not in FIXED_ROPE:
            raise DrafterConfigError(f"rope_type {rope['rope_type']!r}: one of {', '.join(FIXED_ROPE)}")
        ids = self.aux_layer_ids
        if len(ids) != AUX_LAYERS or len(set(ids)) != AUX_LAYERS:
            raise DrafterConfigError(f"aux_layer_ids {list(ids)}: EAGLE-3 taps three distinct layers")
        bad = [i for i in ids if not 0 <= i <= self.num_target_layers]
        if bad:
            raise DrafterConfigError(
                f"aux_layer_ids {bad} do not exist: hidden_states has indices 0..{self.num_target_layers}"
            )
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise DrafterConfigError(
                f"draft_vocab_size {self.draft_vocab_size}: between 1 and the target's {self.vocab_size}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise DrafterConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @classmethod
    def from_target(
        cls, target_config: Any, *, draft_vocab_size: int, aux_layer_ids: list[int] | None = None
    ) -> Eagle3Config:
        hidden = int(config_value(target_config, "hidden_size"))
        heads = int(config_value(target_config, "num_attention_heads"))
        layers = int(config_value(target_config, "num_hidden_layers"))
        rope = drafter_rope(target_config)
        return cls(
            hidden_size=hidden,
            target_hidden_size=hidden,
            vocab_size=int(config_value(target_config, "vocab_size")),
            draft_vocab_size=draft_vocab_size,
            num_attention_heads=heads,
            num_key_value_heads=int(config_value(target_config, "num_key_value_heads") or heads),
            head_dim=int(config_value(target_config, "head_dim") or hidden // heads),
            intermediate_size=int(config_value(target_config, "intermediate_size")),
            num_target_layers=layers,
            aux_layer_ids=tuple(
                aux_layer_ids if aux_layer_ids is not None else default_aux_layer_ids(layers)
            ),
            rms_norm_eps=float(config_value(target_config, "rms_norm_eps", 1e-6)),
            rope_theta=rope["rope_theta"],
            max_position_embeddings=int(config_value(target_config, "max_position_embeddings", 32768)),
            hidden_act=str(config_value(target_config, "hidden_act", "silu")),
            rope_parameters=rope,
        )

    @property
    def target_layer_ids(self) -> list[int]:
        """The tapped `hidden_states` indices as `Target`'s layer ids (index i + 1 for id i)."""
        return [i - 1 for i in self.aux_layer_ids]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aux_layer_ids"] = list(self.aux_layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Eagle3Config:
        return cls(**{**d, "aux_layer_ids": tuple(d["aux_layer_ids"])})

    def to_hf_dict(self) -> dict[str, Any]:
        """The Llama-style layer config (what the rope reads; export builds each server's config)."""
        return {
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": dict(self.rope_parameters),
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "hidden_act": self.hidden_act,
        }


StepKV = tuple[torch.Tensor, torch.Tensor]  # one TTT step's keys and values, (bsz, Hkv, T, D) each


def ttt_attention(
    q: torch.Tensor, steps: list[StepKV], key_ok: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """Step k's attention (k = len(steps) - 1): q (bsz, H, T, D) against step 0's keys causally
    (key s <= query t, and `key_ok` (bsz, T) where given) and steps 1..k's at the same position.
    Returns (bsz, H, T, D). Step 0 goes in chunks of `QUERY_CHUNK` queries."""
    _, heads, t, _ = q.shape
    group = heads // steps[0][0].shape[1]

    def kv(x: torch.Tensor) -> torch.Tensor:  # grouped-query attention: each kv head serves `group`
        return x.repeat_interleave(group, dim=1) if group > 1 else x

    k0, v0 = kv(steps[0][0]), kv(steps[0][1])
    diag_k = [kv(k) for k, _ in steps[1:]]
    diag_v = [kv(v) for _, v in steps[1:]]
    out = torch.empty_like(q)
    keys = torch.arange(t, device=q.device)
    for s in range(0, t, QUERY_CHUNK):
        e = min(t, s + QUERY_CHUNK)
        qc = q[:, :, s:e]
        scores = (qc @ k0[:, :, :e].transpose(-1, -2)).float() * scaling  # (bsz, H, c, e)
        visible = keys[None, :e] <= torch.arange(s, e, device=q.device)[:, None]  # (c, e)
        if key_ok is not None:
            visible = visible[None, None] & key_ok[:, None, None, :e]
        scores = scores.masked_fill(~visible, float("-inf"))
        diag = [((qc * k[:, :, s:e]).sum(-1).float() * scaling)[..., None] for k in diag_k]
        probs = torch.softmax(torch.cat([scores, *diag], dim=-1), dim=-1).to(q.dtype)
        part = probs[..., :e] @ v0[:, :, :e]
        for j, v in enumerate(diag_v):
            part = part + probs[..., e + j : e + j + 1] * v[:, :, s:e]
        out[:, :, s:e] = part
    return out


class Eagle3Attention(nn.Module):
    """q, k, v from the 2H input ([normed embedding ; normed hidden]), rotary, grouped-query."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.head_dim, self.heads, self.kv_heads = (
            cfg.head_dim,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
        )
        self.scaling = cfg.head_dim**-0.5
        wide = 2 * cfg.hidden_size
        self.q_proj = nn.Linear(wide, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(wide, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(wide, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def project(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) of `x` (bsz, T, 2H): (bsz, heads, T, D), rotated at the step's positions."""
        bsz, t, _ = x.shape

        def heads(proj: nn.Linear, n: int) -> torch.Tensor:
            return proj(x).view(bsz, t, n, self.head_dim).transpose(1, 2)

        cos, sin = rope
        q = apply_rope(heads(self.q_proj, self.heads), cos, sin)
        k = apply_rope(heads(self.k_proj, self.kv_heads), cos, sin)
        return q, k, heads(self.v_proj, self.kv_heads)


class Eagle3Layer(nn.Module):
    """The drafter's one decoder layer (state-dict prefix `midlayer.`, as SGLang and EAGLE name it)."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def run(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """The layer over (bsz, n) positions, its attention given as `attend(q, k, v)` (training's
        TTT attention, or decoding's over a cache): h (bsz, n, H), pre-norm."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attn = attend(*self.self_attn.project(x, rope))
        bsz, _, n, _ = attn.shape
        h = hidden + self.self_attn.o_proj(attn.transpose(1, 2).reshape(bsz, n, -1))
        return h + self.mlp(self.post_attention_layernorm(h))

    def step(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        steps: list[StepKV],
        key_ok: torch.Tensor | None,
    ) -> torch.Tensor:
        """One TTT step over every position: appends its keys and values to `steps`; returns h
        (bsz, T, H), pre-norm."""

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            steps.append((k, v))
            return ttt_attention(q, steps, key_ok, self.self_attn.scaling)

        return self.run(embeds, hidden, rope, attend)


def _attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, scaling: float
) -> torch.Tensor:
    """n new queries (bsz, H, n, D) at indices past.. over `keys` (bsz, Hkv, past + n, D): each sees
    every key up to its own index (causal over [past ; new])."""
    n, total = q.shape[2], keys.shape[2]
    group = q.shape[1] // keys.shape[1]
    if group > 1:
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    visible = (
        torch.arange(total, device=q.device)[None, :] <= past + torch.arange(n, device=q.device)[:, None]
    )
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scaling)


class Eagle3Drafter(nn.Module):
    """EAGLE-3's drafter (module doc). State-dict keys: `fc.weight`, `midlayer.*`, `norm.weight`,
    `lm_head.weight` (N, H), `d2t` (N, int64), `t2d` (V, bool); the embedding is the target's."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    def __init__(self, config: Eagle3Config, *, initializer_range: float = 0.02):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(AUX_LAYERS * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary_emb = RotaryEmbedding(config)
        n = config.draft_vocab_size
        self.register_buffer("d2t", torch.zeros(n, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.t2d[:n] = True  # the identity map until `set_vocab`
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=initializer_range)

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """The draft vocabulary (`draftdeck.shards.tools.draft_vocab`), checked: t2d marks exactly the
        ids i + d2t[i], ascending."""
        n, v = self.config.draft_vocab_size, self.config.vocab_size
        d2t, t2d = torch.as_tensor(d2t, dtype=torch.long), torch.as_tensor(t2d, dtype=torch.bool)
        if d2t.shape != (n,) or t2d.shape != (v,):
            raise DrafterConfigError(
                f"a draft vocabulary of {tuple(d2t.shape)} / {tuple(t2d.shape)} for a drafter of {n} ids"
                f" over {v}"
            )
        ids = torch.arange(n) + d2t
        if not (bool((ids[1:] > ids[:-1]).all()) and torch.equal(t2d.nonzero()[:, 0], ids)):
            raise DrafterConfigError("d2t and t2d disagree: i + d2t[i] must be the t2d ids, ascending")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (..., N) of pre-norm hidden states."""
        return self.lm_head(self.norm(hidden))

    def extend(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, past: StepKV | None
    ) -> tuple[torch.Tensor, StepKV]:
        """Decoding: the layer over n new positions (bsz, n, ...) at rope `positions` (bsz, n), after
        `past`'s keys and values, all of which they see (causal among themselves). Returns (h, the
        keys and values of past + new). Step 0 of a drafted chain is `extend` over the newly committed
        (g, next token) pairs; draft j is `extend` of one position whose hidden state is draft j - 1's
        h, with `past` the committed keys plus the chain's: what `ttt` trains, step for step."""
        layer = self.midlayer
        seen = 0 if past is None else past[0].shape[2]
        kept: list[StepKV] = []

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            kept.append((k, v))
            return _attend(q, k, v, seen, layer.self_attn.scaling)

        h = layer.run(embeds, hidden, self.rotary_emb(embeds, positions), attend)
        return h, kept[0]

    def ttt(
        self,
        aux: torch.Tensor,
        embeds: torch.Tensor,
        steps: int,
        attention_mask: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Every step's pre-norm hidden states over a row, (bsz, T, H) each: `aux` (bsz, T, 3 Ht)
        the tapped target states, `embeds` (bsz, T, H) the target's embedding of x[0..T); step k
        at t takes x[t + k + 1] (zeros past the row: such positions are never labelled)."""
        bsz, t, _ = embeds.shape
        hidden = self.fc(aux)
        key_ok = None if attention_mask is None else attention_mask.bool()
        cache: list[StepKV] = []
        out = []
        positions = torch.arange(t, device=embeds.device).expand(bsz, t)
        for k in range(steps):
            shifted = ahead(embeds, k + 1)
            rope = self.rotary_emb(embeds, positions + k)
            hidden = self.midlayer.step(shifted, hidden, rope, cache, key_ok)
            out.append(hidden)
        return out


def ahead(x: torch.Tensor, by: int) -> torch.Tensor:
    """x[:, t + by] at t, for x (bsz, T, ...): zeros past the row."""
    pad = [0, 0] * (x.dim() - 2) + [0, min(by, x.shape[1])]
    return F.pad(x[:, by:], pad)


def ttt_labels(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels, counted), both (bsz, steps, T): step k at position t predicts x[t + k + 2], counted
    where that position exists and its loss mask is 1 (the shifted mask: the first answer token,
    right after the prompt, is supervised)."""
    bsz, t = input_ids.shape
    labels = torch.zeros((bsz, steps, t), dtype=input_ids.dtype, device=input_ids.device)
    counted = torch.zeros((bsz, steps, t), dtype=torch.bool, device=input_ids.device)
    for k in range(steps):
        off = k + 2
        if off < t:
            labels[:, k, : t - off] = input_ids[:, off:]
            counted[:, k, : t - off] = loss_mask[:, off:].bool()
    return labels, counted
