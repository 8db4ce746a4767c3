"""MTP: the target's own multi-token-prediction layer (Qwen3.5/3.6's `mtp.*`), read from its checkpoint,
evaluated as it ships (the eval's floor line: the untouched head), fine-tuned with the target frozen over
unrolled steps (FastMTP, speculators' step weights), and exported alone in speculators' format or
stitched back into the verifier's checkpoint. Its model (model.py), the target's checkpoint read and
stitched (checkpoint.py), trainer part (train.py: EAGLE-3's training-time-test objective and walk over
the target's whole vocabulary), draft source (source.py) and exports with the servers' flags
(export.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftdeck.drafter.kinds.base import DrafterKind, KindOptions, Verifier, size_problems
from draftdeck.drafter.kinds.mtp.options import MTPOptions


class MTP(DrafterKind):
    name = "mtp"
    title = "MTP"
    summary = (
        "the target's own multi-token-prediction layer (Qwen3.5/3.6's mtp.*), fine-tuned over unrolled steps"
        " and stitched back into its checkpoint (mtp_steps, mtp_step_beta); needs a target that ships one"
    )
    options: tuple[type[KindOptions], ...] = (MTPOptions,)
    chain = True
    demo = {"mtp_steps": 7}
    demo_target = "qwen3_5"  # the demo world's target with an MTP layer (draftdeck.drafter.tiny)
    floor = "untouched MTP head"  # `untrained` is the layer as the target ships it
    fsdp_refused = (
        "the MTP layer reads logits through the target's whole LM head, which fsdp splits by vocabulary"
    )
    formats = ("stitched", "speculators")  # auto: what vLLM and SGLang serve
    verifier_formats = ("stitched", "speculators")
    format_names = {
        "speculators": "speculators' MTP format (the layer alone)",
        "stitched": "the verifier's checkpoint with the fine-tuned mtp.* stitched in",
    }

    def trainer(self, params: Any, target: Any, data: Any) -> Any:
        from draftdeck.drafter.kinds.mtp.train import MTPKind

        return MTPKind(params, target, data)

    def slots(self, params: Mapping[str, Any]) -> int:
        return int(params.get("mtp_steps") or 3) + 1

    def drafting(self, block: int) -> str:
        return f"MTP, chains of {block - 1} drafts"

    def plan(self, shape: Any, target_config: Any) -> Any:
        """One layer of the target's own shape, whole on every rank; its logits over the whole
        vocabulary through the target's head."""
        from draftdeck.drafter.kinds.mtp.checkpoint import no_mtp_message
        from draftdeck.drafter.kinds.mtp.model import MTPConfig, MTPDrafter, mtp_layer_count
        from draftdeck.drafter.kinds.mtp.train import estimate_mtp
        from draftdeck.drafter.model.config import DrafterConfigError
        from draftdeck.drafter.model.head import rows_per_chunk
        from draftdeck.drafter.train.plan import PlannedDrafter, meta_count
        from draftdeck.errors import UsageError

        if mtp_layer_count(target_config) == 0:
            raise UsageError(no_mtp_message("the target", "its config declares no mtp_num_hidden_layers"))
        try:
            cfg = MTPConfig.from_target(target_config)
        except DrafterConfigError as e:
            raise UsageError(f"--drafter mtp: {e}") from e
        n, model = meta_count(lambda: MTPDrafter(cfg))
        layer = max(p.numel() for p in model.parameters())
        vocab, hidden = cfg.vocab_size, cfg.hidden_size

        def head(s: Any, world: int) -> int:
            return world * rows_per_chunk(vocab) * (hidden + 2 * vocab) * s.element_size

        def working(shapes: Any) -> Any:
            return estimate_mtp(cfg, target_config, model, shapes, shape.mtp_steps, 0, None)

        return PlannedDrafter(cfg, model, n, layer, 1, vocab, False, working, head)

    def planned(self, plan: Any) -> tuple[str, str]:
        steps = plan.shape.mtp_steps
        return (
            f"the target's MTP layer, {steps} unrolled steps, whole on every rank",
            f"{steps} steps over every position",
        )

    def owns(self, config: Mapping[str, Any]) -> bool:
        return config.get("speculators_model_type") == "mtp"

    def load(self, folder: Path, device: Any = "cpu") -> Any:
        from draftdeck.drafter.kinds.mtp.export import load_mtp

        return load_mtp(folder).to(device).eval()

    def verify_block(self, folder: Path, config: Mapping[str, Any]) -> int:
        from draftdeck.drafter.kinds.mtp.export import trained_drafts

        return trained_drafts(folder) + 1

    def source(self, drafter: Any, target: Any, block: int, threshold: float = 0.0) -> Any:
        from draftdeck.drafter.kinds.mtp.source import MTPSource

        return MTPSource(drafter, target)

    def untrained(self, drafter: Any, seed: int) -> Any:
        """The floor: the target's MTP layer as it ships (read again from the target folder the
        checkpoint names), not a fresh one: what a user has before fine-tuning."""
        from draftdeck.drafter.kinds.mtp.checkpoint import load_into
        from draftdeck.drafter.kinds.mtp.model import MTPDrafter
        from draftdeck.errors import UsageError

        if not drafter.verifier or not Path(drafter.verifier).is_dir():
            raise UsageError(
                f"the untouched MTP head is read from the target the checkpoint names ({drafter.verifier}),"
                " which is not a folder here"
            )
        fresh = load_into(MTPDrafter(drafter.config), Path(drafter.verifier))
        fresh.verifier = drafter.verifier
        return fresh.to(next(drafter.parameters()).device).eval()

    def walked(self, drafter: Any, target: Any, batches: list[Any], block: int) -> Any:
        from draftdeck.drafter.kinds.eagle3.walked import eagle3_heldout_pass

        drafter.share_head(target.lm_head)
        return eagle3_heldout_pass(drafter, target, batches, block - 1, judge=False, with_loss=False)[0]

    def pair_problems(self, drafter: Any, target: Any) -> list[str]:
        cfg = drafter.config
        problems = size_problems(cfg.hidden_size, cfg.vocab_size, target)
        if cfg.num_target_layers != target.num_layers:
            problems.append(
                f"read from a target of {cfg.num_target_layers} layers, this one has {target.num_layers}"
            )
        return problems

    def export(self, drafter: Any, out: Path, fmt: str, verifier: Verifier | None) -> Path:
        from draftdeck.drafter.kinds.mtp.export import export_mtp

        return export_mtp(drafter, out, fmt, verifier, drafter.drafts)

    def served(self, folder: Path, fmt: str, target: str | None, block: int) -> list[dict[str, Any]]:
        from draftdeck.drafter.kinds.mtp.export import launch_flags, readings

        return [
            {**r, "flags": launch_flags(r["server"], folder, fmt, target, block - 1)}
            for r in readings(folder, fmt)
        ]

    def export_summary(self, config: Mapping[str, Any]) -> str:
        if config.get("speculators_model_type") == "mtp":
            methods = config["speculators_config"]["proposal_methods"]
            return f"the MTP layer alone, chains of {methods[0]['speculative_tokens']} drafts"
        return f"the target's own config ({config.get('model_type')}), its mtp.* fine-tuned"

    def reading_line(self, reading: Mapping[str, Any]) -> str:
        problems = reading.get("problems") or []
        return problems[0] if problems else f"{reading['server']}: reads the stitched mtp.* layer"


KIND = MTP()
