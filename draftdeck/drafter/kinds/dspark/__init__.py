"""DSpark (DeepSpec, arXiv 2607.05147; speculators' `dspark`): DFlash's block drafter plus a Markov head
biasing each draft by the one before it and a confidence head predicting each draft's acceptance,
drafting from the anchor by default. Its model (model.py), the trainer's part (train.py), its options
(options.py) and its speculators-format export (export.py); the rest is DFlash's, whose objective, walk
and draft source ask the drafter's own heads (draftdeck.drafter.kinds.dflash)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftdeck.drafter.kinds.base import KindOptions, Verifier
from draftdeck.drafter.kinds.dflash import DFlash
from draftdeck.drafter.kinds.dflash.options import DFlashOptions
from draftdeck.drafter.kinds.dspark.options import DSparkOptions


class DSpark(DFlash):
    name = "dspark"
    title = "DSpark"
    summary = (
        "DFlash's block plus a Markov head biasing each draft by the one before it and a confidence head"
        " (markov_rank, confidence_head), drafting from the anchor"
    )
    options: tuple[type[KindOptions], ...] = (DFlashOptions, DSparkOptions)
    formats = ("speculators",)
    verifier_formats = ("speculators",)
    format_names = {"speculators": "speculators' DSpark format"}
    demo = {"block_size": 7, "anchors_per_seq": 8}  # 7 drafts from the anchor: a verify block of 8
    fsdp_refused = "its Markov head biases the target's head, which fsdp splits by vocabulary"
    confidence = True  # its confidence head may stop a block early (`source(threshold=...)`)

    def confident(self, drafter: Any) -> bool:
        return getattr(drafter, "confidence_head", None) is not None  # --no-confidence-head has none

    def trainer(self, params: Any, target: Any, data: Any) -> Any:
        from draftdeck.drafter.kinds.dspark.train import DSparkKind

        return DSparkKind(params, target)

    def slots(self, params: Mapping[str, Any]) -> int:
        return int(params.get("block_size") or 16) + int(params.get("sample_from_anchor", True) is not False)

    def drafting(self, block: int) -> str:
        return f"DSpark, {block - 1} drafts a step"

    def plan_model(self, shape: Any) -> Any:
        from dataclasses import asdict

        from draftdeck.drafter.kinds.dspark.model import DSparkConfig, DSparkDrafter

        return DSparkDrafter(DSparkConfig(**asdict(shape)))  # the default heads

    def planned(self, plan: Any) -> tuple[str, str]:
        layers = plan.drafter_layers
        drafter = (
            f"DSpark drafter ({layers} layer{'s' if layers > 1 else ''}, default Markov and confidence heads)"
        )
        return drafter, f"{plan.shape.anchors_per_seq} anchors"

    def owns(self, config: Mapping[str, Any]) -> bool:
        return config.get("speculators_model_type") == "dspark"

    def load(self, folder: Path, device: Any = "cpu") -> Any:
        from draftdeck.drafter.kinds.dspark.export import load_dspark

        return load_dspark(folder, device)

    def verify_block(self, folder: Path, config: Mapping[str, Any]) -> int:
        from draftdeck.drafter.kinds.dspark.export import config_of

        cfg = config_of(dict(config))
        return cfg.block_size + int(cfg.sample_from_anchor)

    def source(self, drafter: Any, target: Any, block: int, threshold: float = 0.0) -> Any:
        from draftdeck.drafter.kinds.dflash.source import DFlashSource

        return DFlashSource(drafter, target, block, threshold=threshold)

    def untrained(self, drafter: Any, seed: int) -> Any:
        import torch

        from draftdeck.drafter.kinds.dspark.model import DSparkDrafter

        torch.manual_seed(seed)
        return DSparkDrafter(drafter.dspark).to(next(drafter.parameters()).device).eval()

    def export(self, drafter: Any, out: Path, fmt: str, verifier: Verifier | None) -> Path:
        from draftdeck.drafter.kinds.dspark.export import save_dspark

        return save_dspark(drafter, out, verifier)

    def served(self, folder: Path, fmt: str, target: str | None, block: int) -> list[dict[str, Any]]:
        from draftdeck.drafter.kinds.dspark.export import served

        return served(folder, target, block)

    def export_summary(self, config: Mapping[str, Any]) -> str:
        heads = f"Markov head {config.get('markov_head_type')} (rank {config.get('markov_rank')})"
        confidence = "a confidence head" if config.get("enable_confidence_head") else "no confidence head"
        where = "from the anchor" if config.get("sample_from_anchor") else "after the anchor"
        return f"blocks of {config.get('block_size')} drafting {where}, {heads}, {confidence}"

    def reading_line(self, reading: Mapping[str, Any]) -> str:
        return f"{reading['server']}: {reading['drafts']} drafts a step"


KIND = DSpark()
