"""`MTPDrafter`: the target's own multi-token-prediction layer, as Qwen3.5/3.6 and Qwen3-Next ship it
(`mtp.*` in the checkpoint, `mtp_num_hidden_layers` in the config; transformers skips those weights on
load, vLLM's `Qwen3_5MTP` / `Qwen3NextMTP` serve them with `method: mtp`).

The layer (vLLM's and speculators' `MTPDraftModel` alike): the token's embedding (the target's, frozen)
through `pre_fc_norm_embedding`, the hidden state through `pre_fc_norm_hidden`, concatenated
[embedding ; hidden] and projected by `fc` (2H -> H, bias-free); one full-attention decoder layer of the
target's own architecture (`mtp.layers.0`: gated attention with q/k norms and partial rotary, the MLP);
`mtp.norm`; the target's LM head (frozen). Its normed output is both what the head reads and the hidden
state the next draft takes (vLLM feeds it back so). Every norm is Qwen3.5's zero-centred one (scale
1 + w).

Names: this module's state dict is speculators' (`mtp_layers.0.input_proj`, `token_layernorm`,
`hidden_layernorm`, `final_layernorm`, the decoder layer's own names), so that a checkpoint is also the
speculators export; `NATIVE` maps the target checkpoint's names to it and back (speculators' converter
and `stitch-mtp` use the same table).

Positions: step 0 at position t reads the target's last hidden state at t and the token x[t + 1] and
sits at rope position t (vLLM shifts the ids left over the target's positions); draft k of a chain sits
at t + k (vLLM's proposer adds one per step). Text-only positions make Qwen3.5's three MRoPE sections
equal (speculators' `_prepare_mtp_position_ids` expands them so), which is plain rope over the rotated
quarter of each head.

Chains (FastMTP, vLLM's `num_speculative_tokens` over one layer): the same layer unrolled, draft k + 1
reading draft k's token and output. Training unrolls it as EAGLE-3's training-time test does
(`ttt`: step k at t attends to step 0's keys at positions <= t and its own chain's keys at t), which is
what a decoded chain attends to; speculators' forward instead runs each step as a causal pass over
that step's own keys, which no decoding step sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from draftdeck.drafter.kinds.eagle3.model import StepKV, _attend, ahead, ttt_attention
from draftdeck.drafter.model.config import DrafterConfigError, config_value
from draftdeck.drafter.model.layers import MLP

# the checkpoint's mtp.* names -> this module's (speculators'): exact names first, then prefixes
NATIVE_EXACT = {
    "mtp.fc.weight": "mtp_layers.0.input_proj.weight",
    "mtp.norm.weight": "mtp_layers.0.final_layernorm.weight",
}
NATIVE_PREFIX = (
    ("mtp.pre_fc_norm_hidden.", "mtp_layers.0.hidden_layernorm."),
    ("mtp.pre_fc_norm_embedding.", "mtp_layers.0.token_layernorm."),
    ("mtp.layers.0.", "mtp_layers.0."),
)
MTP_MODEL_TYPES = ("qwen3_5_text",)  # a dense MLP in the layer; Qwen3-Next's and 3.5-MoE's are experts
LAYER_COUNT_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")  # Qwen3.5/Next, DeepSeek/GLM


def ours(native: str) -> str:
    """A checkpoint's `mtp.*` name as this module names it."""
    if native in NATIVE_EXACT:
        return NATIVE_EXACT[native]
    for src, dst in NATIVE_PREFIX:
        if native.startswith(src):
            return dst + native[len(src) :]
    raise KeyError(f"{native}: not an MTP layer weight")


def native(name: str) -> str:
    """This module's name as the target's checkpoint names it (`mtp.*`)."""
    for src, dst in NATIVE_EXACT.items():
        if name == dst:
            return src
    for src, dst in NATIVE_PREFIX:
        if name.startswith(dst):
            return src + name[len(dst) :]
    raise KeyError(f"{name}: not an MTP layer weight")


def mtp_layer_count(target_config: Any) -> int:
    """The MTP layers a target's config declares (0: none)."""
    for key in LAYER_COUNT_KEYS:
        value = config_value(target_config, key)
        if value:
            return int(value)
    return 0


@dataclass(frozen=True)
class MTPConfig:
    """The MTP layer's shape: the target's attention and MLP sizes (the layer is one of its own)."""

    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_target_layers: int
    layer_types: tuple[str, ...] = ()  # the target's, as its config names them (the export's config)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    model_type: str = "qwen3_5_text"

    def __post_init__(self) -> None:
        if self.model_type not in MTP_MODEL_TYPES:
            raise DrafterConfigError(
                f"MTP layers of model_type {self.model_type!r}: DraftDeck reads {', '.join(MTP_MODEL_TYPES)}"
                " (Qwen3.5/3.6 dense: one full-attention layer with a dense MLP)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise DrafterConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @classmethod
    def from_target(cls, target_config: Any) -> MTPConfig:
        """The shape of the MTP layer `target_config` declares (DrafterConfigError naming what is off)."""
        layers = mtp_layer_count(target_config)
        if layers != 1:
            raise DrafterConfigError(
                f"the target declares {layers} MTP layers ({' / '.join(LAYER_COUNT_KEYS)}): the MTP kind"
                " reads exactly one (as speculators and Qwen3.5/3.6 do)"
            )
        rope = config_value(target_config, "rope_parameters") or {}
        if (rope.get("rope_type") or "default") != "default":
            raise DrafterConfigError(
                f"rope_type {rope.get('rope_type')!r}: the MTP layer rotates by the default rope"
            )
        hidden = int(config_value(target_config, "hidden_size"))
        heads = int(config_value(target_config, "num_attention_heads"))
        return cls(
            hidden_size=hidden,
            vocab_size=int(config_value(target_config, "vocab_size")),
            num_attention_heads=heads,
            num_key_value_heads=int(config_value(target_config, "num_key_value_heads") or heads),
            head_dim=int(config_value(target_config, "head_dim") or hidden // heads),
            intermediate_size=int(config_value(target_config, "intermediate_size")),
            num_target_layers=int(config_value(target_config, "num_hidden_layers")),
            layer_types=tuple(config_value(target_config, "layer_types") or ()),
            rms_norm_eps=float(config_value(target_config, "rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta") or config_value(target_config, "rope_theta", 10000.0)),
            partial_rotary_factor=float(rope.get("partial_rotary_factor", 0.25)),
            hidden_act=str(config_value(target_config, "hidden_act", "silu")),
            max_position_embeddings=int(config_value(target_config, "max_position_embeddings", 32768)),
            tie_word_embeddings=bool(config_value(target_config, "tie_word_embeddings", False)),
            model_type=str(config_value(target_config, "model_type")),
        )

    @property
    def target_layer_ids(self) -> list[int]:
        """The target's last hidden state (after its final norm: what vLLM passes its MTP layer) as
        `Target`'s layer id: hidden_states[L]."""
        return [self.num_target_layers - 1]

    @property
    def rope_parameters(self) -> dict[str, Any]:
        return {"rope_type": "default", "rope_theta": self.rope_theta}

    def to_hf_dict(self) -> dict[str, Any]:
        return self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "layer_types": list(self.layer_types)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MTPConfig:
        return cls(**{**d, "layer_types": tuple(d.get("layer_types") or ())})


class CentredRMSNorm(nn.Module):
    """Qwen3.5's RMSNorm: normalised in float32, scaled by 1 + w (w starts at zero), cast back."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] dims of x (bsz, heads, n, D); cos/sin (bsz, n, rot)."""
    rot = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]
    turned, kept = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat((-turned[..., half:], turned[..., :half]), dim=-1)
    return torch.cat((turned * cos + rotated * sin, kept), dim=-1)


class GatedAttention(nn.Module):
    """Qwen3.5's full attention: q_proj gives each head's query and its output gate, q and k are
    normed per head, the first `partial_rotary_factor` of each head rotates, the output is gated by
    sigmoid(gate) before o_proj."""

    def __init__(self, cfg: MTPConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.scaling = cfg.head_dim**-0.5
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.heads * self.head_dim * 2, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = CentredRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = CentredRMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        bsz, n, _ = x.shape
        q, gate = torch.chunk(self.q_proj(x).view(bsz, n, self.heads, 2 * self.head_dim), 2, dim=-1)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(bsz, n, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(bsz, n, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        out = attend(partial_rope(q, cos, sin), partial_rope(k, cos, sin), v)  # (bsz, heads, n, D)
        out = out.transpose(1, 2).reshape(bsz, n, -1) * torch.sigmoid(gate.reshape(bsz, n, -1))
        return self.o_proj(out)


class MTPLayer(nn.Module):
    """One MTP layer (module doc), under speculators' names."""

    def __init__(self, cfg: MTPConfig):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.token_layernorm = CentredRMSNorm(h, eps)
        self.hidden_layernorm = CentredRMSNorm(h, eps)
        self.input_proj = nn.Linear(2 * h, h, bias=False)
        self.input_layernorm = CentredRMSNorm(h, eps)
        self.self_attn = GatedAttention(cfg)
        self.post_attention_layernorm = CentredRMSNorm(h, eps)
        self.mlp = MLP(cfg)
        self.final_layernorm = CentredRMSNorm(h, eps)

    def run(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """The layer over (bsz, n) positions, its attention given as `attend(q, k, v)`: the normed
        output (bsz, n, H)."""
        x = self.input_proj(torch.cat([self.token_layernorm(embeds), self.hidden_layernorm(hidden)], dim=-1))
        x = x + self.self_attn(self.input_layernorm(x), rope, attend)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return self.final_layernorm(x)


class MTPDrafter(nn.Module):
    """The MTP layer (module doc) and the target's LM head it shares (`share_head`: held, not a
    parameter or a state-dict entry). `t2d` marks every target id: its vocabulary is the target's,
    which lets EAGLE-3's objective and walk read it as a chain drafter over a full draft vocabulary."""

    t2d: torch.Tensor
    inv_freq: torch.Tensor

    def __init__(self, config: MTPConfig):
        super().__init__()
        self.config = config
        self.mtp_layers = nn.ModuleList([MTPLayer(config)])
        rot = int(config.head_dim * config.partial_rotary_factor)
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool), persistent=False)
        self.head: nn.Module | None = None
        self.verifier: str | None = None  # the target folder it was read from, where a checkpoint names one
        self.drafts = 3  # the chain's drafts it was trained for, where a checkpoint says (exports name it)

    def share_head(self, head: nn.Module) -> MTPDrafter:
        """Read logits through `head` (the target's, frozen), kept out of parameters and state dict."""
        self.__dict__["head"] = head
        return self

    @property
    def layer(self) -> MTPLayer:
        layer: MTPLayer = self.mtp_layers[0]  # type: ignore[assignment]
        return layer

    def rope(self, like: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.to(like.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(like.dtype), emb.sin().to(like.dtype)

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids  # the target's own vocabulary

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary of the layer's (normed) outputs."""
        if self.head is None:
            raise RuntimeError("the MTP drafter reads logits through its target's LM head: share_head first")
        weight = next(self.head.parameters())
        out: torch.Tensor = self.head(hidden.to(weight.dtype))
        return out

    def extend(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, past: StepKV | None
    ) -> tuple[torch.Tensor, StepKV]:
        """Decoding: the layer over n new positions (bsz, n, ...) at rope `positions`, after `past`'s
        keys and values, causal among themselves. Returns (the outputs, the keys and values of past +
        new), as `Eagle3Drafter.extend` does."""
        seen = 0 if past is None else past[0].shape[2]
        kept: list[StepKV] = []
        scaling = self.layer.self_attn.scaling

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            kept.append((k, v))
            return _attend(q, k, v, seen, scaling)

        h = self.layer.run(embeds, hidden, self.rope(embeds, positions), attend)
        return h, kept[0]

    def ttt(
        self, aux: torch.Tensor, embeds: torch.Tensor, steps: int, attention_mask: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Every step's outputs over a row, (bsz, T, H) each: `aux` the target's last hidden states,
        `embeds` its embedding of x[0..T); step k at t takes x[t + k + 1] at rope position t + k (the
        module doc's unrolling; the same signature as `Eagle3Drafter.ttt`, which the objective calls)."""
        bsz, t, _ = embeds.shape
        key_ok = None if attention_mask is None else attention_mask.bool()
        cache: list[StepKV] = []
        out, hidden = [], aux
        positions = torch.arange(t, device=embeds.device).expand(bsz, t)
        scaling = self.layer.self_attn.scaling

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            cache.append((k, v))
            return ttt_attention(q, cache, key_ok, scaling)

        for k in range(steps):
            hidden = self.layer.run(ahead(embeds, k + 1), hidden, self.rope(embeds, positions + k), attend)
            out.append(hidden)
        return out
