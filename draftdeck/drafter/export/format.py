"""The drafter in z-lab's format, which z-lab's `dflash` package, vLLM (`"method": "dflash"`) and SGLang
(`--speculative-algorithm DFLASH`) load: a folder with an HF `config.json` (a Qwen3 config plus
`dflash_config` {block_size, target_layer_ids, mask_token_id, ...}, architectures `DFlashDraftModel`;
servers.py says which keys each server reads) and `model.safetensors` (the drafter's state dict; its
keys are z-lab's).

Writes are atomic: the folder is assembled under a temporary name beside the destination and
renamed into place, so a reader sees the old export or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.model.config import DrafterConfig, drafter_rope, rope_theta_of
from draftdeck.drafter.model.dflash import DFlashDrafter
from draftdeck.errors import UsageError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"


class CheckpointError(UsageError):
    """A drafter folder that cannot be read (missing files, not a DFlash config, keys that differ)."""


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


def write_folder(out_dir: Path, state: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> Path:
    """`state` as model.safetensors and `config` as config.json in `out_dir`, atomically (module doc)."""
    from safetensors.torch import save_file

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        for path in tmp.iterdir():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
        old = None
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def load_zlab(folder: Path, *, device: str | torch.device = "cpu") -> DFlashDrafter:
    """Load a z-lab-format folder into our `DFlashDrafter`; any missing or unexpected key is an error."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path, weights = folder / CONFIG, folder / WEIGHTS
    for path in (cfg_path, weights):
        if not path.is_file():
            raise CheckpointError(f"{folder}: no {path.name}: not a DFlash drafter folder")
    try:
        hf = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: cannot read: {e}") from e
    drafter = DFlashDrafter(config_from_hf(hf))
    state = load_file(str(weights))
    result = drafter.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{weights}: keys differ from the drafter's: missing {sorted(result.missing_keys)}, "
            f"unexpected {sorted(result.unexpected_keys)}"
        )
    return drafter.to(device).eval()


def resolve_checkpoint(path: Path) -> Path:
    """The drafter folder `path` names: a checkpoint (config.json + model.safetensors, what the
    trainer writes per step and what `export_drafter` writes), or a train run folder / its
    `checkpoints/` folder, resolved to the best checkpoint by held-out tau (else the latest)."""
    from draftdeck.drafter.train.checkpoint import CheckpointStore

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: the checkpoint folder does not exist")
    if (path / CONFIG).is_file():
        return path
    run = path.parent if path.name == "checkpoints" else path
    store = CheckpointStore(run)
    if not store.index_path.is_file():
        raise CheckpointError(
            f"{path}: neither a drafter checkpoint (no {CONFIG}) nor a train run (no checkpoints/index.json)"
        )
    idx = store.index()
    entry = next((c for c in idx.checkpoints if c["step"] == idx.best), None)
    if entry is not None:
        return store.dir / entry["path"]
    latest = store.latest()
    if latest is None:
        raise CheckpointError(f"{store.index_path}: the run has no checkpoint yet")
    return latest
