"""DFlash2 (z-lab; speculators' `dflash2`): DFlash's block drafter with local token-conditioned
convolutions around each sublayer and a low-rank candidate selector reranking the head's top-k drafts
given the draft before each. Its model (model.py), the trainer's part (train.py), its options
(options.py) and its speculators-format export (export.py); the rest is DFlash's, whose objective, walk
and draft source ask the drafter's own heads (draftdeck.drafter.kinds.dflash)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftdeck.drafter.kinds.base import KindOptions, Verifier
from draftdeck.drafter.kinds.dflash import DFlash
from draftdeck.drafter.kinds.dflash.options import DFlashOptions
from draftdeck.drafter.kinds.dflash2.options import DFlash2Options


class DFlash2(DFlash):
    name = "dflash2"
    title = "DFlash2"
    summary = (
        "DFlash's block with local convolutions over its slots and a selector reranking each draft's top"
        " candidates given the draft before it (conv_kernel_size, selector_rank)"
    )
    options: tuple[type[KindOptions], ...] = (DFlashOptions, DFlash2Options)
    formats = ("speculators",)
    verifier_formats = ("speculators",)
    format_names = {"speculators": "speculators' DFlash2 format"}
    fsdp_refused = (
        "its candidate selector reranks the top-k of the target's head, which fsdp splits by vocabulary"
    )

    def trainer(self, params: Any, target: Any, data: Any) -> Any:
        from draftdeck.drafter.kinds.dflash2.train import DFlash2Kind

        return DFlash2Kind(params, target)

    def drafting(self, block: int) -> str:
        return f"DFlash2, blocks of {block} ({block - 1} drafts)"

    def plan_model(self, shape: Any) -> Any:
        from dataclasses import asdict

        from draftdeck.drafter.kinds.dflash2.model import DFlash2Config, DFlash2Drafter

        cfg = asdict(shape)
        group = next(g for g in (16, 8, 4, 2, 1) if cfg["hidden_size"] % g == 0)
        return DFlash2Drafter(DFlash2Config(**cfg, conv_group_size=group))  # the default selector

    def planned(self, plan: Any) -> tuple[str, str]:
        layers = plan.drafter_layers
        return f"DFlash2 drafter ({layers} layer{'s' if layers > 1 else ''}, the default selector)", (
            f"{plan.shape.anchors_per_seq} anchors"
        )

    def owns(self, config: Mapping[str, Any]) -> bool:
        return config.get("speculators_model_type") == "dflash2"

    def load(self, folder: Path, device: Any = "cpu") -> Any:
        from draftdeck.drafter.kinds.dflash2.export import load_dflash2

        return load_dflash2(folder, device)

    def verify_block(self, folder: Path, config: Mapping[str, Any]) -> int:
        from draftdeck.drafter.kinds.dflash2.export import config_of

        cfg = config_of(dict(config))
        return cfg.block_size + int(cfg.sample_from_anchor)

    def source(self, drafter: Any, target: Any, block: int, threshold: float = 0.0) -> Any:
        from draftdeck.drafter.kinds.dflash.source import DFlashSource
        from draftdeck.errors import UsageError

        if block != drafter.slots:  # its convolutions are over blocks of the size it was trained with
            raise UsageError(
                f"block_size {block}: a DFlash2 drafter verifies blocks of its own, {drafter.slots}"
            )
        return DFlashSource(drafter, target, block)

    def untrained(self, drafter: Any, seed: int) -> Any:
        import torch

        from draftdeck.drafter.kinds.dflash2.model import DFlash2Drafter

        torch.manual_seed(seed)
        return DFlash2Drafter(drafter.dflash2).to(next(drafter.parameters()).device).eval()

    def export(self, drafter: Any, out: Path, fmt: str, verifier: Verifier | None) -> Path:
        from draftdeck.drafter.kinds.dflash2.export import save_dflash2

        return save_dflash2(drafter, out, verifier)

    def served(self, folder: Path, fmt: str, target: str | None, block: int) -> list[dict[str, Any]]:
        from draftdeck.drafter.kinds.dflash2.export import served

        return served(folder, target, block)

    def export_summary(self, config: Mapping[str, Any]) -> str:
        return (
            f"blocks of {config.get('block_size')}, convolutions of {config.get('conv_kernel_size')} taps,"
            f" a selector over the top {config.get('selector_top_k')} (rank {config.get('selector_rank')})"
        )

    def reading_line(self, reading: Mapping[str, Any]) -> str:
        return f"{reading['server']}: {reading['drafts']} drafts a step"


KIND = DFlash2()
