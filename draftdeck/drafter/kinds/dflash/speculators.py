"""A DFlash-family drafter's config.json in speculators' format (speculators 0.9.0's
`DFlashSpeculatorConfig` and the configs that extend it, `dspark`, `dflash2`), which its model classes,
vLLM and `vllm serve <dir>` read: `speculators_model_type` and `architectures` name the kind, the decoder
layers' shape is a Qwen3 `transformer_layer_config`, the tapped layers are `aux_hidden_state_layer_ids`
(hidden_states indices: z-lab's target layer ids + 1), the verifier the target. A `dflash_config` block
(z-lab's keys) rides beside it for the readers that look there, and a `draftdeck` block keeps what
speculators has no key for (how the mask id was chosen), so that the config reads back whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from draftdeck.drafter.export.folder import WEIGHTS, CheckpointError, read_config
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.model.config import DrafterConfig, drafter_rope, rope_theta_of

SPECULATORS_VERSION = "0.9.0"


def speculators_config(
    cfg: DrafterConfig,
    kind: str,
    architectures: list[str],
    fields: Mapping[str, Any],
    verifier: Verifier | None = None,
    drafts: int | None = None,
) -> dict[str, Any]:
    """`cfg` as the config.json of speculators' `kind`, with the kind's own `fields`; `verifier`: the
    target (what speculators' class and `vllm serve <dir>` load as the target; None: a checkpoint's
    config, which names none);
    `drafts`: the tokens a step proposes (the block's, by default)."""
    layer = {
        "model_type": "qwen3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": dict(cfg.rope_parameters),
        "attention_bias": cfg.attention_bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * cfg.layers,
    }
    dflash: dict[str, Any] = {
        "block_size": cfg.block_size,
        "target_layer_ids": list(cfg.target_layer_ids),
        "mask_token_id": cfg.mask_token_id,
        "num_target_layers": cfg.num_target_layers,
    }
    if cfg.mask_token is not None:
        dflash["mask_token"] = cfg.mask_token
    return {
        "architectures": architectures,
        "speculators_model_type": kind,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": drafts if drafts is not None else cfg.block_size - 1,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": verifier.to_dict() if verifier else {"name_or_path": None, "architectures": []},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.vocab_size,
        "block_size": cfg.block_size,
        "target_hidden_size": cfg.hidden_size,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        "mask_token_id": cfg.mask_token_id,
        **fields,
        "dflash_config": dflash,
        "draftdeck": {"mask_token_source": cfg.mask_token_source},
    }


def drafter_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The `DrafterConfig` fields of a speculators-format config.json (the inverse of
    `speculators_config`; a config another tool wrote reads too: the target's layer count is then the
    deepest tapped layer's)."""
    layer = hf["transformer_layer_config"]
    heads = int(layer["num_attention_heads"])
    dflash = hf.get("dflash_config") or {}
    ids = [int(i) - 1 for i in hf["aux_hidden_state_layer_ids"]]
    return {
        "hidden_size": int(layer["hidden_size"]),
        "vocab_size": int(layer["vocab_size"]),
        "layers": int(layer["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(layer.get("num_key_value_heads") or heads),
        "head_dim": int(layer.get("head_dim") or int(layer["hidden_size"]) // heads),
        "intermediate_size": int(layer["intermediate_size"]),
        "num_target_layers": int(dflash.get("num_target_layers") or max(ids) + 1),
        "target_layer_ids": tuple(ids),
        "mask_token_id": int(hf["mask_token_id"]),
        "mask_token_source": str((hf.get("draftdeck") or {}).get("mask_token_source", "draft_config")),
        "mask_token": dflash.get("mask_token"),
        "block_size": int(hf["block_size"]),
        "rms_norm_eps": float(layer.get("rms_norm_eps", 1e-6)),
        "rope_theta": rope_theta_of(layer),
        "rope_parameters": drafter_rope(layer),
        "max_position_embeddings": int(layer.get("max_position_embeddings", 32768)),
        "attention_bias": bool(layer.get("attention_bias", False)),
        "hidden_act": str(layer.get("hidden_act", "silu")),
    }


def load_folder(folder: Path, build: Callable[[dict[str, Any]], nn.Module], title: str, device: Any) -> Any:
    """The drafter `build` makes from a folder's config.json, its model.safetensors loaded into it with
    every key the drafter's and none missing, in eval mode on `device`."""
    from safetensors.torch import load_file

    drafter = build(read_config(Path(folder)))
    result = drafter.load_state_dict(load_file(str(Path(folder) / WEIGHTS)), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{Path(folder) / WEIGHTS}: keys differ from a {title} drafter's: missing"
            f" {sorted(result.missing_keys)}, unexpected {sorted(result.unexpected_keys)}"
        )
    return drafter.to(device).eval()


def served(
    folder: Path, target: str | None, block: int, *, vllm: str, sglang: str, note: str = "",
    sglang_problems: Sequence[str] = (),
) -> list[dict[str, Any]]:  # fmt: skip
    """vLLM's and SGLang's reading of a speculators-format export of a verify `block` (1 + its drafts):
    the drafts a step proposes, the launch flags (`vllm`: the speculative config's method; `sglang`: the
    speculative algorithm; `note`: said after vLLM's flags) and what each would get wrong."""
    hf = read_config(folder)
    drafts = block - 1
    model = target or "<target>"
    problems = []
    if (hf.get("speculators_config") or {}).get("verifier", {}).get("name_or_path") is None:
        problems.append(
            "no verifier named: `vllm serve <dir>` alone cannot find the target (export with --target)"
        )
    spec = f'{{"method": "{vllm}", "model": "{folder}", "num_speculative_tokens": {drafts}}}'
    return [
        {
            "server": "vllm",
            "drafts": drafts,
            "flags": f"vllm serve {model} --speculative-config '{spec}'" + (f"  ({note})" if note else ""),
            "problems": problems,
        },
        {
            "server": "sglang",
            "drafts": drafts,
            "flags": f"python -m sglang.launch_server --model-path {model} --speculative-algorithm {sglang}"
            f" --speculative-draft-model-path {folder} --speculative-num-draft-tokens {block}",
            "problems": list(sglang_problems),
        },
    ]
