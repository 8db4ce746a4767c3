"""An MTP drafter's two exports, and how each server reads them.

- **speculators** (`speculators_model_type: mtp`, architectures `MTPDraftModel`): the MTP layer alone,
  what speculators' `MTPDraftModel.from_pretrained` loads (its embedding and LM head read from the
  verifier the config names) and what its `stitch-mtp` writes back into a verifier. Weights under
  speculators' names (`mtp_layers.0.*`, the module's own); the layer's config is the target's text config
  (`transformer_layer_config`, model_type `qwen3_5_text`); `num_nextn_predict_layers: 1`; the chain's
  length as the greedy proposal's `speculative_tokens`. A checkpoint is this format.
- **stitched**: the verifier's own checkpoint with the fine-tuned weights as its `mtp.*` tensors, every
  other tensor and file the original's (checked): what vLLM serves with `--speculative-config
  '{"method": "mtp", "num_speculative_tokens": K}'` and SGLang with `--speculative-algorithm NEXTN`,
  both reading the MTP layer from the model's own checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftdeck.drafter.export.folder import CONFIG, WEIGHTS, CheckpointError, write_folder
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.mtp.model import MTPConfig, MTPDrafter
from draftdeck.errors import UsageError

DEFAULT_DRAFTS = 3  # a chain's drafts when a folder does not say how it was trained (speculators' default)
FORMATS = ("stitched", "speculators")


def layer_config(cfg: MTPConfig) -> dict[str, Any]:
    """The target's text config as speculators' `transformer_layer_config` rebuilds it."""
    return {
        "model_type": cfg.model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_target_layers,
        "layer_types": list(cfg.layer_types),
        "rms_norm_eps": cfg.rms_norm_eps,
        "vocab_size": cfg.vocab_size,
        "hidden_act": cfg.hidden_act,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor,
        },
        "attention_bias": False,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "mtp_num_hidden_layers": 1,
    }


def speculators_config(cfg: MTPConfig, drafts: int, verifier: Verifier | None) -> dict[str, Any]:
    """speculators' MTP config.json (module doc)."""
    return {
        "speculators_model_type": "mtp",
        "architectures": ["MTPDraftModel"],
        "transformer_layer_config": layer_config(cfg),
        "num_nextn_predict_layers": 1,
        "speculators_config": {
            "algorithm": "mtp",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": drafts}],
            "verifier": verifier.to_dict() if verifier else {"name_or_path": None, "architectures": []},
        },
    }


def config_from_speculators(hf: dict[str, Any]) -> MTPConfig:
    """The layer's shape from a speculators MTP config.json."""
    layer = hf["transformer_layer_config"]
    rope = layer.get("rope_parameters") or {}
    return MTPConfig(
        hidden_size=int(layer["hidden_size"]),
        vocab_size=int(layer["vocab_size"]),
        num_attention_heads=int(layer["num_attention_heads"]),
        num_key_value_heads=int(layer["num_key_value_heads"]),
        head_dim=int(layer["head_dim"]),
        intermediate_size=int(layer["intermediate_size"]),
        num_target_layers=int(layer["num_hidden_layers"]),
        layer_types=tuple(layer.get("layer_types") or ()),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        partial_rotary_factor=float(rope.get("partial_rotary_factor", 0.25)),
        hidden_act=str(layer.get("hidden_act", "silu")),
        max_position_embeddings=int(layer.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(layer.get("tie_word_embeddings", False)),
        model_type=str(layer["model_type"]),
    )


def save_speculators(drafter: MTPDrafter, out: Path, drafts: int, verifier: Verifier | None) -> Path:
    config = speculators_config(drafter.config, drafts, verifier)
    config["dtype"] = str(next(drafter.parameters()).dtype).removeprefix("torch.")
    return write_folder(Path(out), drafter.state_dict(), config)


def load_mtp(folder: Path) -> MTPDrafter:
    """A speculators-format MTP folder (a checkpoint or an export) read back: every key matched, none
    left over; `verifier` set to the folder its config names (where the untouched layer is read)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        hf = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        cfg = config_from_speculators(hf)
        state = load_file(str(folder / WEIGHTS))
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{folder}: not a readable MTP export: {e!r}") from e
    drafter = MTPDrafter(cfg)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{folder}: keys missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    drafter.verifier = (hf.get("speculators_config") or {}).get("verifier", {}).get("name_or_path")
    drafter.drafts = trained_drafts(folder)
    return drafter


def trained_drafts(folder: Path) -> int:
    """The chain's drafts a checkpoint was trained for (its drafter.json's steps; an export's proposal)."""
    folder = Path(folder)
    written = folder / "drafter.json"
    if written.is_file():
        return int(json.loads(written.read_text(encoding="utf-8")).get("mtp_steps", DEFAULT_DRAFTS))
    hf = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    methods = (hf.get("speculators_config") or {}).get("proposal_methods") or [{}]
    return int(methods[0].get("speculative_tokens", DEFAULT_DRAFTS))


def export_mtp(drafter: MTPDrafter, out: Path, fmt: str, verifier: Verifier | None, drafts: int) -> Path:
    """Write `drafter` in `fmt` (module doc); the stitched format needs the verifier's folder."""
    if fmt == "speculators":
        return save_speculators(drafter, out, drafts, verifier)
    if fmt != "stitched":
        raise UsageError(f"format {fmt}: an MTP drafter exports as {' or '.join(FORMATS)}")
    if verifier is None or not Path(verifier.name_or_path).is_dir():
        raise UsageError(
            "the stitched export writes into a copy of the verifier: add --target with its folder"
        )
    from draftdeck.drafter.kinds.mtp.checkpoint import stitch

    return stitch(drafter, Path(verifier.name_or_path), Path(out))


def readings(folder: Path, fmt: str) -> list[dict[str, Any]]:
    """How vLLM and SGLang read an export: both serve the MTP layer from the model's own checkpoint,
    so the speculators format must be stitched first."""
    if fmt == "stitched":
        return [{"server": s, "problems": []} for s in ("vllm", "sglang")]
    why = (
        "{} reads the MTP layer from the served model's own checkpoint: export --format stitched (or"
        " speculators' stitch-mtp)"
    )
    return [{"server": s, "problems": [why.format(s)]} for s in ("vllm", "sglang")]


def launch_flags(server: str, folder: Path, fmt: str, target: str | None, drafts: int) -> str:
    """The command that serves the stitched model with chains of `drafts` drafts (greedy, top-1)."""
    model = str(folder) if fmt == "stitched" else "<the stitched verifier>"
    if server == "vllm":
        spec = json.dumps({"method": "mtp", "num_speculative_tokens": drafts})
        return f"vllm serve {model} --speculative-config '{spec}'"
    return (
        f"python -m sglang.launch_server --model-path {model} --speculative-algorithm NEXTN"
        f" --speculative-num-steps {drafts} --speculative-eagle-topk 1"
        f" --speculative-num-draft-tokens {drafts + 1}"
    )
