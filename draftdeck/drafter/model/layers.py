"""The parts both drafters' decoder layers are built of (Qwen3 / Llama style): RMSNorm, rotary
embeddings (the default rope, or a scaled one by transformers' own functions), the SwiGLU MLP.
They read their shape from any config with `LayerShape`'s fields (`DrafterConfig`, `Eagle3Config`).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F


class LayerShape(Protocol):
    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def hidden_act(self) -> str: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def rope_parameters(self) -> dict[str, Any]: ...
    def to_hf_dict(self) -> dict[str, Any]: ...


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: normalise in float32, cast back, then scale."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class RotaryEmbedding(nn.Module):
    """Rotary embedding over the whole head: (cos, sin) of shape (bsz, len, head_dim). The default
    rope computed here; a scaled one (`config.rope_parameters`: linear, llama3, yarn) by transformers'
    own functions, as the exported config makes every server compute it, yarn's attention factor
    included."""

    inv_freq: torch.Tensor

    def __init__(self, config: LayerShape):
        super().__init__()
        head_dim, kind = config.head_dim, config.rope_parameters["rope_type"]
        self.attention_scaling = 1.0
        if kind == "default":
            steps = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
            inv = 1.0 / (config.rope_theta**steps)
        else:
            from transformers import Qwen3Config
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv, self.attention_scaling = ROPE_INIT_FUNCTIONS[kind](Qwen3Config(**config.to_hf_dict()), None)
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device_type = x.device.type if x.device.type != "mps" else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            freqs = position_ids[..., None].float() * self.inv_freq.float().to(x.device)
            emb = torch.cat((freqs, freqs), dim=-1)
            if self.attention_scaling == 1.0:
                return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
            scale = self.attention_scaling
            return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (bsz, heads, len, d); cos/sin: (bsz, len, d)."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + _rotate_half(x) * sin


class MLP(nn.Module):
    def __init__(self, cfg: LayerShape):
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r}: the drafter implements silu only")
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
