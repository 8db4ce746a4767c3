"""DFlash (z-lab): a block drafted in parallel from the target's context. Its model (model.py), objective
over sampled anchors (objective.py), held-out walk (walked.py), trainer part (train.py), draft source
(source.py), z-lab's export format (export.py) and the servers' readings of it (servers.py)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from draftdeck.drafter.kinds.base import DrafterKind, KindOptions, Verifier, size_problems
from draftdeck.drafter.kinds.dflash.options import DFlashOptions


class DFlash(DrafterKind):
    name = "dflash"
    title = "DFlash"
    summary = "a block drafted in parallel from the target's context (block_size, layers)"
    options: tuple[type[KindOptions], ...] = (DFlashOptions,)
    formats = ("zlab",)
    format_names = {"zlab": "z-lab's DFlash format"}
    demo = {"block_size": 8, "anchors_per_seq": 8}

    def trainer(self, params: Any, target: Any, data: Any) -> Any:
        from draftdeck.drafter.kinds.dflash.train import DFlashKind

        return DFlashKind(params, target)

    def slots(self, params: Mapping[str, Any]) -> int:
        return int(params.get("block_size") or 16)

    def drafting(self, block: int) -> str:
        return f"DFlash, blocks of {block} ({block - 1} drafts)"

    def plan(self, shape: Any, target_config: Any) -> Any:
        from draftdeck.drafter.kinds.dflash.memory import estimate
        from draftdeck.drafter.model.config import DrafterConfig
        from draftdeck.drafter.train.plan import PlannedDrafter, meta_count

        cfg = DrafterConfig.from_target(
            target_config, layers=shape.layers, block_size=shape.block_size, mask_token_id=0,
            target_layer_ids=list(shape.target_layer_ids) if shape.target_layer_ids else None,
        )  # fmt: skip
        n, model = meta_count(lambda: self.plan_model(cfg))
        layer = max(sum(p.numel() for p in lay.parameters()) for lay in model.layers)
        hidden = int(target_config.hidden_size)

        def head(s: Any, world: int) -> int:  # the split head gathers every rank's slots of one call
            slots = s.batch_size * min(s.anchors_per_forward, s.anchors_per_seq) * s.block_size
            return world * slots * hidden * 4 * (3 if s.kl else 2)

        def working(shapes: Any) -> Any:
            return estimate(cfg, target_config, model, shapes, held=0, capacity=None)

        return PlannedDrafter(cfg, model, n, layer, shape.layers, None, True, working, head)

    def plan_model(self, shape: Any) -> Any:
        """The drafter the plan counts, of a DFlash shape (`DrafterConfig`)."""
        from draftdeck.drafter.kinds.dflash.model import DFlashDrafter

        return DFlashDrafter(shape)

    def planned(self, plan: Any) -> tuple[str, str]:
        layers = plan.drafter_layers
        return (
            f"DFlash drafter ({layers} layer{'s' if layers > 1 else ''})",
            f"{plan.shape.anchors_per_seq} anchors",
        )

    def owns(self, config: Mapping[str, Any]) -> bool:
        """z-lab's format: a `dflash_config` (the family's speculators-format exports carry one too, and
        name their kind)."""
        return isinstance(config.get("dflash_config"), Mapping) and config.get("speculators_model_type") in (
            None,
            "dflash",
        )

    def load(self, folder: Path, device: Any = "cpu") -> Any:
        from draftdeck.drafter.kinds.dflash.export import load_zlab

        return load_zlab(folder, device=device)

    def verify_block(self, folder: Path, config: Mapping[str, Any]) -> int:
        from draftdeck.drafter.kinds.dflash.export import config_from_hf

        return config_from_hf(config).block_size

    def source(self, drafter: Any, target: Any, block: int, threshold: float = 0.0) -> Any:
        from draftdeck.drafter.kinds.dflash.source import DFlashSource

        return DFlashSource(drafter, target, block)

    def untrained(self, drafter: Any, seed: int) -> Any:
        import torch

        from draftdeck.drafter.kinds.dflash.model import DFlashDrafter

        torch.manual_seed(seed)
        return DFlashDrafter(drafter.config).to(next(drafter.parameters()).device).eval()

    def walked(self, drafter: Any, target: Any, batches: list[Any], block: int) -> Any:
        from draftdeck.drafter.kinds.dflash.walked import heldout_counts

        walker = copy.copy(drafter)  # shares the weights; only the block size may differ
        walker.block_size = block - drafter.shift  # the verify block less the drafts from the anchor
        return heldout_counts(walker, target, batches, gamma=7.0)

    def pair_problems(self, drafter: Any, target: Any) -> list[str]:
        cfg = drafter.config
        problems = size_problems(cfg.hidden_size, cfg.vocab_size, target)
        bad = [i for i in cfg.target_layer_ids if i >= target.num_layers]
        if bad:
            problems.append(f"target layers {bad} do not exist (the target has {target.num_layers})")
        return problems

    def export(self, drafter: Any, out: Path, fmt: str, verifier: Verifier | None) -> Path:
        from draftdeck.drafter.kinds.dflash.export import save_zlab

        return save_zlab(drafter, out)

    def served(self, folder: Path, fmt: str, target: str | None, block: int) -> list[dict[str, Any]]:
        from draftdeck.drafter.kinds.dflash.servers import read_export

        return [asdict(r) | {"problems": list(r.problems)} for r in read_export(folder, target, block)]

    def tree_flags(self, server: str, tree: Mapping[str, int]) -> str | None:
        # DDTree over DFlash's block: SGLang PR #29907 (vLLM's, PR #42910, is open). A kind built on
        # DFlash serves its own trees (DFlash2's beam tree, SGLang PR #36196).
        if self.name != "dflash" or server.lower() != "sglang":
            return None
        return f"--speculative-ddtree-budget {tree['budget']}"

    def export_summary(self, config: Mapping[str, Any]) -> str:
        d = config.get("dflash_config") or {}
        return (
            f"block {d.get('block_size')}, target layers {d.get('target_layer_ids')}, mask id"
            f" {d.get('mask_token_id')}"
        )

    def reading_line(self, reading: Mapping[str, Any]) -> str:
        mask = "unknown" if reading["mask_token_id"] is None else reading["mask_token_id"]
        return f"{reading['server']} ({reading['source']}): mask id {mask}, {reading['mask_from']}"


KIND = DFlash()
