"""The drafter in z-lab's format, which z-lab's `dflash` package, vLLM (`"method": "dflash"`) and SGLang
(`--speculative-algorithm DFLASH`) load: a folder with an HF `config.json` (a Qwen3 config plus
`dflash_config` {block_size, target_layer_ids, mask_token_id, ...}, architectures `DFlashDraftModel`;
servers.py says which keys each server reads) and `model.safetensors` (the drafter's state dict; its
keys are z-lab's), written atomically (`draftdeck.drafter.export.folder`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.export.folder import CONFIG, WEIGHTS, CheckpointError, read_config, write_folder
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.model.config import DrafterConfig, drafter_rope, rope_theta_of


def config_from_hf(hf: Mapping[str, Any], *, mask_token_source: str = "draft_config") -> DrafterConfig:
    """The `DrafterConfig` of a z-lab `config.json` (the inverse of `DrafterConfig.to_hf_dict`)."""
    dflash = hf.get("dflash_config")
    if not isinstance(dflash, Mapping):
        raise CheckpointError("config.json has no dflash_config: not a DFlash drafter")
    try:
        heads = int(hf["num_attention_heads"])
        return DrafterConfig(
            hidden_size=int(hf["hidden_size"]),
            vocab_size=int(hf["vocab_size"]),
            layers=int(hf["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
            intermediate_size=int(hf["intermediate_size"]),
            num_target_layers=int(
                dflash.get("num_target_layers")
                or hf.get("num_target_layers")
                or max(dflash["target_layer_ids"]) + 1
            ),
            target_layer_ids=tuple(int(i) for i in dflash["target_layer_ids"]),
            mask_token_id=int(dflash["mask_token_id"]),
            mask_token_source=mask_token_source,
            mask_token=dflash.get("mask_token"),
            block_size=int(dflash.get("block_size", hf.get("block_size", 16))),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta_of(hf),
            rope_parameters=drafter_rope(hf),
            max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            attention_bias=bool(hf.get("attention_bias", False)),
            hidden_act=str(hf.get("hidden_act", "silu")),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a complete DFlash config: {e!r}") from e


def save_zlab(drafter: DFlashDrafter, out_dir: Path) -> Path:
    """Write `drafter` to `out_dir` in z-lab's format, atomically (replacing an earlier export)."""
    hf = drafter.config.to_hf_dict()
    hf["dtype"] = str(next(drafter.parameters()).dtype).removeprefix("torch.")
    return write_folder(Path(out_dir), drafter.state_dict(), hf)


def load_zlab(folder: Path, *, device: str | torch.device = "cpu") -> DFlashDrafter:
    """Load a z-lab-format folder into our `DFlashDrafter`; any missing or unexpected key is an error."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path, weights = folder / CONFIG, folder / WEIGHTS
    for path in (cfg_path, weights):
        if not path.is_file():
            raise CheckpointError(f"{folder}: no {path.name}: not a DFlash drafter folder")
    drafter = DFlashDrafter(config_from_hf(read_config(folder)))
    state = load_file(str(weights))
    result = drafter.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{weights}: keys differ from the drafter's: missing {sorted(result.missing_keys)}, "
            f"unexpected {sorted(result.unexpected_keys)}"
        )
    return drafter.to(device).eval()
