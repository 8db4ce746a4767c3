"""An EAGLE-3 drafter's two on-disk formats as servers read them (the module doc of
`draftdeck.drafter.kinds.eagle3.export` says which server reads which): their config.json, both ways, and
their weights' names. The trainer writes its checkpoints in the flat one, export either."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch

from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.eagle3.model import Eagle3Config, Eagle3Drafter
from draftdeck.drafter.model.config import DrafterConfigError

Eagle3Format = Literal["speculators", "sglang"]
FORMATS: tuple[Eagle3Format, ...] = ("speculators", "sglang")
LAYER_PREFIX = {"speculators": "layers.0.", "sglang": "midlayer."}
NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def _layer_config(cfg: Eagle3Config) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": dict(cfg.rope_parameters),
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def eagle3_config(cfg: Eagle3Config, fmt: Eagle3Format, verifier: Verifier | None = None) -> dict[str, Any]:
    """The config.json of `fmt` (module doc); `verifier`: the target speculators' `speculators_config`
    names (what `vllm serve <dir>` loads as the target; None: a checkpoint's config, which names none)."""
    if fmt == "speculators":
        return {
            "speculators_model_type": "eagle3",
            "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": _layer_config(cfg),
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
            **{flag: False for flag in NORM_FLAGS},
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "verifier": verifier.to_dict() if verifier else {"name_or_path": None, "architectures": []},
            },
        }
    return {
        **_layer_config(cfg),
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),  # vLLM's, read first
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layer_ids]},  # SGLang's
    }


def eagle3_state(drafter: Eagle3Drafter, fmt: Eagle3Format) -> dict[str, torch.Tensor]:
    """The drafter's weights under `fmt`'s names (ours are the flat format's)."""
    prefix = LAYER_PREFIX[fmt]
    return {
        (prefix + k.removeprefix("midlayer.") if k.startswith("midlayer.") else k): v
        for k, v in drafter.state_dict().items()
    }


def config_from_hf(hf: Mapping[str, Any]) -> tuple[Eagle3Config, Eagle3Format]:
    """Our config from either format's config.json, and which format it is."""
    if hf.get("speculators_model_type") == "eagle3":
        layer, ids, fmt = (
            hf["transformer_layer_config"],
            list(hf["eagle_aux_hidden_state_layer_ids"]),
            "speculators",
        )
    elif "LlamaForCausalLMEagle3" in (hf.get("architectures") or []):
        layer, fmt = hf, "sglang"
        ids = [i + 1 for i in hf["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    else:
        raise DrafterConfigError("config.json is neither a speculators EAGLE-3 config nor a flat one")
    cfg = Eagle3Config(
        hidden_size=int(layer["hidden_size"]),
        target_hidden_size=int(hf.get("target_hidden_size") or layer["hidden_size"]),
        vocab_size=int(layer["vocab_size"]),
        draft_vocab_size=int(hf["draft_vocab_size"]),
        num_attention_heads=int(layer["num_attention_heads"]),
        num_key_value_heads=int(layer["num_key_value_heads"]),
        head_dim=int(layer["head_dim"]),
        intermediate_size=int(layer["intermediate_size"]),
        num_target_layers=max(ids) + 3,  # not in either format: enough for the ids to exist
        aux_layer_ids=tuple(int(i) for i in ids),
        rms_norm_eps=float(layer["rms_norm_eps"]),
        rope_theta=float(layer["rope_theta"]),
        max_position_embeddings=int(layer["max_position_embeddings"]),
        hidden_act=str(layer.get("hidden_act", "silu")),
        rope_parameters=dict(layer.get("rope_parameters") or {}),
    )
    return cfg, fmt  # type: ignore[return-value]
