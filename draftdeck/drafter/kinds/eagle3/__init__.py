"""EAGLE-3: one layer over three tapped target layers drafting a chain token by token over a draft
vocabulary, trained by unrolling it over its own drafts (training-time test). Its model and config
(model.py), the two checkpoint formats (formats.py: speculators' and SGLang's flat one), the TTT
objective (objective.py), the held-out walk (walked.py), trainer part (train.py), draft source
(source.py) and export with the servers' readings (export.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

from draftdeck.drafter.kinds.base import DrafterKind, KindOptions, Verifier, size_problems
from draftdeck.drafter.kinds.eagle3.options import DEFAULT_DRAFT_VOCAB, Eagle3Options, Eagle3VocabOptions


class Eagle3(DrafterKind):
    name = "eagle3"
    title = "EAGLE-3"
    summary = (
        "one layer drafting a chain token by token over a draft vocabulary, trained by unrolling it over its"
        " own drafts, TTT (ttt_steps, draft_vocab_size)"
    )
    options: tuple[type[KindOptions], ...] = (Eagle3Options, Eagle3VocabOptions)
    chain = True
    demo = {"ttt_steps": 7}
    formats = ("speculators", "sglang")
    verifier_formats = ("speculators",)
    format_names = {
        "speculators": "speculators' EAGLE-3 format",
        "sglang": "the flat EAGLE-3 format SGLang and vLLM load",
    }

    def trainer(self, params: Any, target: Any, data: Any) -> Any:
        from draftdeck.drafter.kinds.eagle3.train import Eagle3Kind

        return Eagle3Kind(params, target, data)

    def slots(self, params: Mapping[str, Any]) -> int:
        return int(params.get("ttt_steps") or 7) + 1  # a chain of ttt_steps drafts: slot k is TTT step k - 1

    def drafting(self, block: int) -> str:
        return f"EAGLE-3, chains of {block - 1} drafts"

    def plan(self, shape: Any, target_config: Any) -> Any:
        """One layer over a draft vocabulary, whole on every rank (its gradients summed parameter by
        parameter): under fsdp only the target is split, and one call of its view over the draft
        vocabulary gathers every rank's rows and logits."""
        from draftdeck.drafter.kinds.eagle3.memory import estimate_eagle3
        from draftdeck.drafter.kinds.eagle3.model import Eagle3Config, Eagle3Drafter
        from draftdeck.drafter.model.head import rows_per_chunk
        from draftdeck.drafter.train.plan import PlannedDrafter, meta_count

        vocab = int(target_config.vocab_size)
        cfg = Eagle3Config.from_target(
            target_config, draft_vocab_size=min(shape.draft_vocab_size or DEFAULT_DRAFT_VOCAB, vocab),
            aux_layer_ids=list(shape.eagle3_layer_ids) if shape.eagle3_layer_ids else None,
        )  # fmt: skip
        n, model = meta_count(lambda: Eagle3Drafter(cfg))
        layer = max(p.numel() for p in model.parameters())  # summed over ranks one at a time
        hidden = int(target_config.hidden_size)

        def head(s: Any, world: int) -> int:
            return world * rows_per_chunk(vocab) * (hidden + 2 * vocab) * s.element_size

        def working(shapes: Any) -> Any:
            return estimate_eagle3(cfg, target_config, model, shapes, shape.ttt_steps, held=0, capacity=None)

        return PlannedDrafter(cfg, model, n, layer, 1, cfg.draft_vocab_size, False, working, head)

    def planned(self, plan: Any) -> tuple[str, str]:
        steps = plan.shape.ttt_steps
        vocab = f"{plan.draft_vocab_size:,} draft ids"
        drafter = f"EAGLE-3 drafter, {steps} TTT steps over {vocab}, whole on every rank"
        return drafter, f"{steps} TTT steps over every position"

    def owns(self, config: Mapping[str, Any]) -> bool:
        """Speculators' format, or SGLang's flat one (formats.py reads both)."""
        architectures = config.get("architectures") or []
        return config.get("speculators_model_type") == "eagle3" or "LlamaForCausalLMEagle3" in architectures

    def load(self, folder: Path, device: Any = "cpu") -> Any:
        from draftdeck.drafter.kinds.eagle3.export import load_eagle3

        return load_eagle3(folder).to(device).eval()

    def verify_block(self, folder: Path, config: Mapping[str, Any]) -> int:
        from draftdeck.drafter.kinds.eagle3.export import trained_drafts

        return trained_drafts(folder) + 1

    def source(self, drafter: Any, target: Any, block: int, threshold: float = 0.0) -> Any:
        from draftdeck.drafter.kinds.eagle3.source import Eagle3Source

        return Eagle3Source(drafter, target)

    def untrained(self, drafter: Any, seed: int) -> Any:
        import torch

        from draftdeck.drafter.kinds.eagle3.model import Eagle3Drafter

        torch.manual_seed(seed)
        fresh = Eagle3Drafter(drafter.config)
        fresh.set_vocab(drafter.d2t.cpu(), drafter.t2d.cpu())  # the same draft vocabulary
        return fresh.to(next(drafter.parameters()).device).eval()

    def walked(self, drafter: Any, target: Any, batches: list[Any], block: int) -> Any:
        from draftdeck.drafter.kinds.eagle3.walked import eagle3_heldout_pass

        return eagle3_heldout_pass(drafter, target, batches, block - 1, judge=False, with_loss=False)[0]

    def pair_problems(self, drafter: Any, target: Any) -> list[str]:
        cfg = drafter.config
        problems = size_problems(cfg.target_hidden_size, cfg.vocab_size, target)
        bad = [i for i in cfg.aux_layer_ids if i > target.num_layers]
        if bad:
            problems.append(f"hidden_states {bad} do not exist (the target has {target.num_layers} layers)")
        return problems

    def export(self, drafter: Any, out: Path, fmt: str, verifier: Verifier | None) -> Path:
        from draftdeck.drafter.kinds.eagle3.export import save_eagle3

        return save_eagle3(drafter, out, cast(Any, fmt), verifier)

    def served(self, folder: Path, fmt: str, target: str | None, block: int) -> list[dict[str, Any]]:
        from draftdeck.drafter.kinds.eagle3.export import eagle3_readings, launch_flags
        from draftdeck.drafter.train.plan import target_config

        config = target_config(target) if target is not None else None
        return [
            {
                **asdict(r),
                "tapped": list(r.tapped),
                "problems": list(r.problems),
                "flags": launch_flags(r.server, folder, cast(Any, fmt), target, block - 1),
            }
            for r in eagle3_readings(folder, config)
        ]

    def tree_flags(self, server: str, tree: Mapping[str, int]) -> str | None:
        # SGLang's EAGLE tree: the depth in steps, topk children per node, and the verified nodes with
        # the root (its argparse keeps the last of a repeated option, so these replace the chain's).
        # vLLM's speculative_token_tree is a static tree, not EAGLE-2's dynamic one.
        if self.name != "eagle3" or server.lower() != "sglang":
            return None
        return (
            f"--speculative-num-steps {tree['depth']} --speculative-eagle-topk {tree['topk']}"
            f" --speculative-num-draft-tokens {tree['budget'] + 1}"
        )

    def export_summary(self, config: Mapping[str, Any]) -> str:
        taps = config.get("eagle_aux_hidden_state_layer_ids")
        return f"draft vocabulary {config.get('draft_vocab_size')}, hidden_states {taps}"

    def reading_line(self, reading: Mapping[str, Any]) -> str:
        tapped = reading["tapped"]
        taps = f"taps hidden_states {tapped}" if tapped else "reads no layer ids from this format"
        return f"{reading['server']}: {taps}"


KIND = Eagle3()
