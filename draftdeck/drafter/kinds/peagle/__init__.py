"""P-EAGLE (parallel EAGLE; speculators' `peagle`): EAGLE-3's one layer over three tapped target layers
and its draft vocabulary, drafting all K positions of a verify step in one forward (learned `mask_hidden`
inputs for the positions not yet known), trained with COD sampling. Its model (model.py), COD sampling
(cod.py), objective (objective.py), held-out walk (walked.py), trainer part (train.py), draft source
(source.py) and speculators-format export with the servers' readings (export.py); the rest is
EAGLE-3's (draftdeck.drafter.kinds.eagle3), whose modules it imports."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftdeck.drafter.kinds.base import KindOptions, Verifier
from draftdeck.drafter.kinds.eagle3 import Eagle3
from draftdeck.drafter.kinds.eagle3.options import Eagle3VocabOptions
from draftdeck.drafter.kinds.peagle.options import PEagleOptions


class PEagle(Eagle3):
    name = "peagle"
    title = "P-EAGLE"
    summary = (
        "EAGLE-3's layer drafting all K positions of a step in one forward (learned mask-hidden inputs),"
        " trained with COD sampling (num_depths, down_sample_ratio)"
    )
    options: tuple[type[KindOptions], ...] = (Eagle3VocabOptions, PEagleOptions)
    chain = True
    demo = {"num_depths": 7}
    formats = ("speculators",)  # type: ignore[assignment]  # EAGLE-3's flat format has no P-EAGLE
    verifier_formats = ("speculators",)
    format_names = {"speculators": "speculators' P-EAGLE format (vLLM: EAGLE-3 with parallel drafting)"}

    def trainer(self, params: Any, target: Any, data: Any) -> Any:
        from draftdeck.drafter.kinds.peagle.train import PEagleKind

        return PEagleKind(params, target, data)

    def slots(self, params: Mapping[str, Any]) -> int:
        return int(params.get("num_depths") or 8) + 1  # K drafts: slot d + 1 is depth d

    def drafting(self, block: int) -> str:
        return f"P-EAGLE, chains of {block - 1} drafts in one forward"

    def plan(self, shape: Any, target_config: Any) -> Any:
        """EAGLE-3's plan (one layer over a draft vocabulary, whole on every rank) with the default COD
        sampling's positions in place of TTT steps (memory.py)."""
        import math
        from dataclasses import replace

        from draftdeck.drafter.kinds.peagle.memory import kept_share

        fields = PEagleOptions.model_fields  # the plan's shape names no P-EAGLE option: the defaults
        share = kept_share(
            int(fields["num_depths"].default), float(fields["down_sample_ratio"].default),
            float(fields["down_sample_ratio_min"].default),
        )  # fmt: skip
        return super().plan(replace(shape, ttt_steps=math.ceil(share)), target_config)

    def planned(self, plan: Any) -> tuple[str, str]:
        vocab = f"{plan.draft_vocab_size:,} draft ids"
        return f"P-EAGLE drafter over {vocab}, whole on every rank", "the chains COD sampling keeps"

    def owns(self, config: Mapping[str, Any]) -> bool:
        return config.get("speculators_model_type") == "peagle"

    def load(self, folder: Path, device: Any = "cpu") -> Any:
        from draftdeck.drafter.kinds.peagle.export import load_peagle

        return load_peagle(folder).to(device).eval()

    def verify_block(self, folder: Path, config: Mapping[str, Any]) -> int:
        from draftdeck.drafter.kinds.peagle.export import config_of

        return config_of(dict(config)).num_depths + 1

    def source(self, drafter: Any, target: Any, block: int, threshold: float = 0.0) -> Any:
        from draftdeck.drafter.kinds.peagle.source import PEagleSource

        return PEagleSource(drafter, target)

    def untrained(self, drafter: Any, seed: int) -> Any:
        import torch

        from draftdeck.drafter.kinds.peagle.model import PEagleDrafter

        torch.manual_seed(seed)
        fresh = PEagleDrafter(drafter.config)
        fresh.set_vocab(drafter.d2t.cpu(), drafter.t2d.cpu())  # the same draft vocabulary
        return fresh.to(next(drafter.parameters()).device).eval()

    def walked(self, drafter: Any, target: Any, batches: list[Any], block: int) -> Any:
        from draftdeck.drafter.kinds.peagle.walked import peagle_heldout_pass

        return peagle_heldout_pass(drafter, target, batches, block - 1, judge=False, with_loss=False)[0]

    def export(self, drafter: Any, out: Path, fmt: str, verifier: Verifier | None) -> Path:
        from draftdeck.drafter.kinds.peagle.export import save_peagle

        return save_peagle(drafter, out, verifier)

    def served(self, folder: Path, fmt: str, target: str | None, block: int) -> list[dict[str, Any]]:
        from draftdeck.drafter.kinds.peagle.export import served

        return served(folder, target, block)

    def export_summary(self, config: Mapping[str, Any]) -> str:
        drafts = (
            (config.get("speculators_config") or {})
            .get("proposal_methods", [{}])[0]
            .get("speculative_tokens")
        )
        taps = config.get("eagle_aux_hidden_state_layer_ids")
        return (
            f"{drafts} parallel drafts, mask token {config.get('mask_token_id')}, draft vocabulary"
            f" {config.get('draft_vocab_size')}, hidden_states {taps}"
        )

    def reading_line(self, reading: Mapping[str, Any]) -> str:
        if not reading["drafts"]:
            return f"{reading['server']}: serves no P-EAGLE"
        return f"{reading['server']}: {reading['drafts']} parallel drafts a step"


KIND = PEagle()
