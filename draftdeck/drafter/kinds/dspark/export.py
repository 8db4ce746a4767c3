"""A DSpark drafter's folder in speculators' format (`speculators_model_type: dspark`, architectures
`DSparkSpeculator`), which speculators 0.9.0's `DSparkDraftModel` loads key for key and vLLM serves
(`method: dspark`, PR #46995); the checkpoint's config.json is already in it. What each server reads
of it, and the flags that launch it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.export.folder import CheckpointError, read_config, write_folder
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.dflash.speculators import drafter_fields, load_folder, speculators_config
from draftdeck.drafter.kinds.dflash.speculators import served as speculators_served
from draftdeck.drafter.kinds.dspark.model import DSparkConfig, DSparkDrafter

KIND = "dspark"
ARCHITECTURES = ["DSparkSpeculator"]


def config_json(cfg: DSparkConfig, verifier: Verifier | None = None) -> dict[str, Any]:
    fields = {
        "sample_from_anchor": cfg.sample_from_anchor,
        "sliding_window_non_causal": False,
        "markov_rank": cfg.markov_rank,
        "markov_head_type": cfg.markov_head_type,
        "enable_confidence_head": cfg.confidence_head,
        "confidence_head_with_markov": cfg.confidence_with_markov,
    }
    drafts = cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1
    return speculators_config(cfg, KIND, ARCHITECTURES, fields, verifier, drafts=drafts)


def config_of(hf: dict[str, Any]) -> DSparkConfig:
    try:
        return DSparkConfig(
            **drafter_fields(hf),
            markov_rank=int(hf.get("markov_rank", 256)),
            markov_head_type=str(hf.get("markov_head_type", "vanilla")),
            confidence_head=bool(hf.get("enable_confidence_head", True)),
            confidence_with_markov=bool(hf.get("confidence_head_with_markov", True)),
            sample_from_anchor=bool(hf.get("sample_from_anchor", True)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a complete DSpark config: {e!r}") from e


def save_dspark(drafter: DSparkDrafter, out: Path, verifier: Verifier | None = None) -> Path:
    return write_folder(Path(out), drafter.state_dict(), config_json(drafter.dspark, verifier))


def load_dspark(folder: Path, device: Any = "cpu") -> DSparkDrafter:
    drafter: DSparkDrafter = load_folder(folder, lambda hf: DSparkDrafter(config_of(hf)), "DSpark", device)
    return drafter


def served(folder: Path, target: str | None, block: int) -> list[dict[str, Any]]:
    """vLLM serves it as `dspark`, SGLang as DSPARK (which drafts from the anchor)."""
    after = not config_of(read_config(folder)).sample_from_anchor
    problem = "sample_from_anchor false: SGLang's DSPARK drafts from the anchor, this drafter after it"
    return speculators_served(
        folder, target, block, vllm="dspark", sglang="DSPARK", sglang_problems=[problem] if after else []
    )


def warm_start(drafter: DSparkDrafter, checkpoint: Path) -> str:
    """The DFlash backbone's weights of a DFlash checkpoint or run of the same shape, into `drafter`
    (its heads start fresh). Returns what was loaded, for the job's log."""
    from draftdeck.drafter.export.folder import resolve_checkpoint
    from draftdeck.drafter.kinds.dflash.export import load_zlab

    folder = resolve_checkpoint(Path(checkpoint))
    hf = read_config(folder)
    if "dflash_config" not in hf or hf.get("speculators_model_type") not in (None, "dflash"):
        raise CheckpointError(f"{folder}: init_from takes a DFlash checkpoint or run (this is another kind)")
    source = load_zlab(folder).state_dict()
    own = drafter.state_dict()
    backbone = {k for k in own if not k.startswith(("markov_head.", "confidence_head."))}
    differ = [k for k, v in source.items() if k not in own or own[k].shape != v.shape]
    differ += sorted(backbone - set(source))  # a layer it lacks would start fresh unsaid
    if differ:
        raise CheckpointError(
            f"{folder}: its DFlash drafter is of another shape than this run's ({', '.join(differ[:4])}):"
            " same target, layers and tapped layers needed"
        )
    with torch.no_grad():
        for k, v in source.items():
            own[k].copy_(v)
    return f"warm start: the DFlash layers of {folder} ({len(source)} tensors); the heads start fresh"
