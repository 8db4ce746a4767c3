"""A DFlash2 drafter's folder in speculators' format (`speculators_model_type: dflash2`, architectures
`DFlash2DraftModel`, which vLLM picks DFlash2 by, PR #52816; SGLang PR #35371), which speculators
0.9.0's `DFlash2DraftModel` loads key for key; the checkpoint's config.json is already in it. What each
server reads of it, and the flags that launch it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftdeck.drafter.export.folder import CheckpointError, write_folder
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.dflash.speculators import drafter_fields, load_folder, speculators_config
from draftdeck.drafter.kinds.dflash.speculators import served as speculators_served
from draftdeck.drafter.kinds.dflash2.model import DFlash2Config, DFlash2Drafter

KIND = "dflash2"
ARCHITECTURES = ["DFlash2DraftModel"]


def config_json(cfg: DFlash2Config, verifier: Verifier | None = None) -> dict[str, Any]:
    fields = {
        "sample_from_anchor": cfg.sample_from_anchor,
        "sliding_window_non_causal": True,
        "conv_kernel_size": cfg.conv_kernel_size,
        "conv_group_size": cfg.conv_group_size,
        "selector_rank": cfg.selector_rank,
        "selector_top_k": cfg.selector_top_k,
    }
    drafts = cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1
    return speculators_config(cfg, KIND, ARCHITECTURES, fields, verifier, drafts=drafts)


def config_of(hf: dict[str, Any]) -> DFlash2Config:
    try:
        return DFlash2Config(
            **drafter_fields(hf),
            conv_kernel_size=int(hf.get("conv_kernel_size", 2)),
            conv_group_size=int(hf.get("conv_group_size", 16)),
            selector_rank=int(hf.get("selector_rank", 256)),
            selector_top_k=int(hf.get("selector_top_k", 16)),
            sample_from_anchor=bool(hf.get("sample_from_anchor", False)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json is not a complete DFlash2 config: {e!r}") from e


def save_dflash2(drafter: DFlash2Drafter, out: Path, verifier: Verifier | None = None) -> Path:
    return write_folder(Path(out), drafter.state_dict(), config_json(drafter.dflash2, verifier))


def load_dflash2(folder: Path, device: Any = "cpu") -> DFlash2Drafter:
    drafter: DFlash2Drafter = load_folder(folder, lambda hf: DFlash2Drafter(config_of(hf)), "DFlash2", device)
    return drafter


def served(folder: Path, target: str | None, block: int) -> list[dict[str, Any]]:
    """vLLM serves it as `dflash`, picking DFlash2 by its architectures; SGLang as DFLASH."""
    return speculators_served(
        folder, target, block, vllm="dflash", sglang="DFLASH", note="DFlash2 by its architectures"
    )
