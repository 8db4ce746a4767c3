"""`DrafterConfig`: the shape of a DFlash drafter, derived from its target's HF config.

The drafter's decoder layers are Qwen3-style and share the target's hidden size (they reuse its
embedding and LM head). What DFlash adds is recorded here too: the block size, the target layers
whose hidden states condition the draft, and the spare token id that fills the masked block slots,
together with how that id was chosen (``mask_token_source``), because a wrong mask id is a silent
failure and the run record must say where it came from.

Mask id resolution follows SpecForge's order: an explicit value, the draft config's
``dflash_config.mask_token_id``, the tokenizer's mask token, the first embedding row the tokenizer
never produces, the pad token, the eos token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from draftdeck.errors import UsageError

FEW_LAYERS = 6  # targets with fewer layers than this feed every layer to the drafter
# The mask token string SGLang looks up (and adds to the target's tokenizer when missing, which gives
# it the id len(tokenizer): the first unused embedding row) when a config names no other.
DEFAULT_MASK_TOKEN = "<|MASK|>"

MASK_SOURCES = (
    "explicit",
    "draft_config",
    "tokenizer_mask_token",
    "unused_embedding_row",
    "pad_token",
    "eos_token",
)


class DrafterConfigError(UsageError):
    """A drafter setting the target cannot serve (block size, layer id, mask id, shape)."""


def default_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """Target layers to condition on: every layer for a small target (fewer than 6 layers), else
    `count` ids spread evenly from 1 to L-3 (z-lab's choice: [1, 9, 17, 25, 33] for 36 layers and 5
    ids; the middle layer when only one is asked for)."""
    n_layers = num_target_layers
    if n_layers < FEW_LAYERS:
        return list(range(n_layers))
    if count <= 1:
        return [n_layers // 2]
    start, end = 1, n_layers - 3
    return [round(start + i * (end - start) / (count - 1)) for i in range(count)]


def config_value(cfg: Any, name: str, default: Any = None) -> Any:
    """`name` of an HF config object or of its dict."""
    if isinstance(cfg, Mapping):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def rope_theta_of(cfg: Any) -> float:
    """The rope base of an HF config (transformers 5 keeps it in `rope_parameters`)."""
    params = config_value(cfg, "rope_parameters") or {}
    if isinstance(params, Mapping) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = config_value(cfg, "rope_theta")
    return float(theta) if theta is not None else 10000.0


# Rope kinds whose frequencies the config fixes: the drafter takes the target's as they are, and
# transformers, vLLM and SGLang compute the same frequencies from the exported config.
FIXED_ROPE = ("default", "linear", "llama3", "yarn")


def drafter_rope(cfg: Any) -> dict[str, Any]:
    """The drafter's own rope parameters, from its target's config (object or dict).

    The target's kind and scaling where its frequencies are fixed (`FIXED_ROPE`: yarn for gpt-oss
    and DeepSeek-V3, llama3 for Llama 3.1): the drafter reads contexts as long as its target's, so it
    takes the same frequencies. Over the drafter's whole head: partial rotary (Qwen3.5/3.6 rotate a
    quarter of theirs) belongs to the target's attention; the drafter's layers are Qwen3's, which
    rotate every dimension, as servers' drafter models do (they ignore `partial_rotary_factor`:
    speculators #613). A kind whose frequencies change with the sequence length at run time (dynamic,
    longrope) gives the default rope at the target's base. Gemma 3 keeps a rope per layer type: the
    drafter takes its full-attention layers' (it attends over the whole context)."""
    params = config_value(cfg, "rope_parameters") or config_value(cfg, "rope_scaling") or {}
    if isinstance(params, Mapping) and isinstance(params.get("full_attention"), Mapping):
        params = params["full_attention"]
    params = dict(params) if isinstance(params, Mapping) else {}
    kind = params.get("rope_type", params.get("type")) or "default"
    theta = float(params.get("rope_theta") or rope_theta_of(cfg))
    if kind not in FIXED_ROPE:
        return {"rope_type": "default", "rope_theta": theta}
    kept = {k: v for k, v in params.items() if k not in ("type", "partial_rotary_factor", "rope_theta")}
    return {**kept, "rope_type": kind, "rope_theta": theta}


def resolve_mask_token_id(
    vocab_size: int,
    *,
    explicit: int | None = None,
    draft_config: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
) -> tuple[int, str]:
    """(mask token id, how it was resolved: one of MASK_SOURCES), in SpecForge's order."""
    candidates: list[tuple[str, Any]] = [("explicit", explicit)]
    dflash = (draft_config or {}).get("dflash_config") or {}
    candidates.append(
        ("draft_config", dflash.get("mask_token_id", (draft_config or {}).get("mask_token_id")))
    )
    if tokenizer is not None:
        candidates.append(("tokenizer_mask_token", getattr(tokenizer, "mask_token_id", None)))
        used = len(tokenizer)
        candidates.append(("unused_embedding_row", used if used < vocab_size else None))
        candidates.append(("pad_token", getattr(tokenizer, "pad_token_id", None)))
        candidates.append(("eos_token", getattr(tokenizer, "eos_token_id", None)))
    for source, value in candidates:
        if value is None:
            continue
        value = int(value)
        if not 0 <= value < vocab_size:
            raise DrafterConfigError(
                f"mask_token_id {value} (from {source.replace('_', ' ')}) is outside the target's "
                f"vocabulary of {vocab_size} rows"
            )
        return value, source
    raise DrafterConfigError(
        "no mask_token_id: give one explicitly, or a tokenizer with a mask, pad or eos token "
        "or an unused embedding row"
    )


def mask_token_text(tokenizer: Any, mask_id: int) -> str | None:
    """The string that names `mask_id` in `tokenizer`, for servers that resolve the mask by its text
    (SGLang): the token itself, or DEFAULT_MASK_TOKEN for the first unused row (adding it to the
    tokenizer gives exactly that id). None when no string leads back to `mask_id`."""
    if tokenizer is None:
        return None
    used = len(tokenizer)
    if mask_id < used:
        text = tokenizer.convert_ids_to_tokens(mask_id)
        return text if isinstance(text, str) and tokenizer.get_vocab().get(text) == mask_id else None
    if mask_id == used and DEFAULT_MASK_TOKEN not in tokenizer.get_vocab():
        return DEFAULT_MASK_TOKEN
    return None


@dataclass(frozen=True)
class DrafterConfig:
    """Everything that fixes a drafter's shape and its DFlash behaviour.

    hidden_size, vocab_size and the attention shapes default to the target's; `layers` is the
    number of drafter decoder layers (z-lab's `num_hidden_layers`); `num_target_layers` the
    target's layer count (kept so `to_hf_dict` round-trips with z-lab's config).
    """

    hidden_size: int
    vocab_size: int
    layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    mask_token_source: str = "explicit"
    mask_token: str | None = None  # the mask id's text in the target's tokenizer (mask_token_text)
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    hidden_act: str = "silu"
    # the drafter's rope (`drafter_rope`); empty: the default rope at `rope_theta` (checkpoints before
    # scaled rope was carried over)
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rope = {"rope_type": "default", **self.rope_parameters, "rope_theta": self.rope_theta}
        object.__setattr__(self, "rope_parameters", rope)
        if rope["rope_type"] not in FIXED_ROPE:
            raise DrafterConfigError(
                f"rope_type {rope['rope_type']!r}: the drafter's rope is one of {', '.join(FIXED_ROPE)}"
            )
        if self.block_size < 2:
            raise DrafterConfigError(
                f"block_size {self.block_size}: a block needs the anchor and at least one slot"
            )
        if self.block_size > self.max_position_embeddings:
            raise DrafterConfigError(
                f"block_size {self.block_size} exceeds the target's max_position_embeddings "
                f"{self.max_position_embeddings}"
            )
        if self.layers < 1:
            raise DrafterConfigError(f"layers {self.layers}: the drafter needs at least one decoder layer")
        if not self.target_layer_ids:
            raise DrafterConfigError("target_layer_ids is empty")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise DrafterConfigError(
                f"target_layer_ids {bad} do not exist: the target has layers 0..{self.num_target_layers - 1}"
            )
        if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
            raise DrafterConfigError(f"target_layer_ids {list(self.target_layer_ids)} repeat a layer")
        if self.num_attention_heads % self.num_key_value_heads:
            raise DrafterConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise DrafterConfigError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DrafterConfigError(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary of {self.vocab_size}"
            )
        if self.mask_token_source not in MASK_SOURCES:
            raise DrafterConfigError(
                f"mask_token_source {self.mask_token_source!r} is not one of {MASK_SOURCES}"
            )

    @classmethod
    def from_target(
        cls,
        target_config: Any,
        *,
        tokenizer: Any = None,
        layers: int = 1,
        block_size: int = 16,
        target_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        draft_config: Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> DrafterConfig:
        """Derive a drafter config from the target's HF config (object or dict).

        `overrides` may set num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
        rms_norm_eps or rope_theta when the drafter should differ from the target there.
        """
        hidden = int(config_value(target_config, "hidden_size"))
        heads = int(config_value(target_config, "num_attention_heads"))
        n_target = int(config_value(target_config, "num_hidden_layers"))
        vocab = int(config_value(target_config, "vocab_size"))
        ids = (
            list(target_layer_ids)
            if target_layer_ids is not None
            else default_target_layer_ids(n_target, layers)
        )
        mask_id, source = resolve_mask_token_id(
            vocab, explicit=mask_token_id, draft_config=draft_config, tokenizer=tokenizer
        )
        values: dict[str, Any] = {
            "num_attention_heads": heads,
            "num_key_value_heads": int(config_value(target_config, "num_key_value_heads") or heads),
            "head_dim": int(config_value(target_config, "head_dim") or hidden // heads),
            "intermediate_size": int(config_value(target_config, "intermediate_size")),
            "rms_norm_eps": float(config_value(target_config, "rms_norm_eps", 1e-6)),
            "rope_theta": (rope := drafter_rope(target_config))["rope_theta"],
        }
        unknown = set(overrides) - set(values)
        if unknown:
            raise DrafterConfigError(f"unknown drafter settings {sorted(unknown)}; allowed: {sorted(values)}")
        values.update(overrides)
        return cls(
            hidden_size=hidden,
            vocab_size=vocab,
            layers=layers,
            num_target_layers=n_target,
            target_layer_ids=tuple(int(i) for i in ids),
            mask_token_id=mask_id,
            mask_token_source=source,
            mask_token=mask_token_text(tokenizer, mask_id),
            block_size=block_size,
            max_position_embeddings=int(config_value(target_config, "max_position_embeddings", 32768)),
            hidden_act=str(config_value(target_config, "hidden_act", "silu")),
            rope_parameters=rope,
            **values,
        )

    @property
    def scaled_rope(self) -> dict[str, Any] | None:
        """The rope's scaling without its base, None for the default rope."""
        if self.rope_parameters["rope_type"] == "default":
            return None
        return {k: v for k, v in self.rope_parameters.items() if k != "rope_theta"}

    @property
    def context_size(self) -> int:
        """Width of the concatenated target features that enter `fc`."""
        return len(self.target_layer_ids) * self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DrafterConfig:
        values = dict(d)
        values["target_layer_ids"] = tuple(values["target_layer_ids"])
        return cls(**values)

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF `config.json` z-lab's `DFlashDraftModel` reads (a Qwen3 config plus `dflash_config`),
        with what vLLM's and SGLang's loaders read besides (the DFlash kind's servers.py says which key
        each reads, and where): `target_hidden_size`, `num_target_layers` and `block_size` in
        both places, and the mask as an id and, where one names it, as text."""
        dflash: dict[str, Any] = {
            "block_size": self.block_size,
            "target_layer_ids": list(self.target_layer_ids),
            "mask_token_id": self.mask_token_id,
            "num_target_layers": self.num_target_layers,
        }
        if self.mask_token is not None:
            dflash["mask_token"] = self.mask_token
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "target_hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": dict(self.rope_parameters),
            # transformers 4 (z-lab's pinned loader) reads a scaled rope here
            "rope_scaling": None if self.scaled_rope is None else dict(self.scaled_rope),
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": False,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": dflash,
        }
