"""What the trainer does for an MTP run (draftdeck.drafter.train.drafters.TrainKind): the drafter is the
target's own MTP layer read from its checkpoint (not initialised), fine-tuned with the target frozen,
unrolled `mtp_steps` times with speculators' step weights, through EAGLE-3's training-time-test objective
over the target's whole vocabulary (the shared loss mix and counts), and its held-out walk."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftdeck.drafter.kinds.eagle3.train import UnrolledChain
from draftdeck.drafter.kinds.mtp.checkpoint import from_target
from draftdeck.drafter.kinds.mtp.export import speculators_config
from draftdeck.drafter.kinds.mtp.model import MTPConfig, MTPDrafter
from draftdeck.drafter.model.attention import Backend
from draftdeck.drafter.model.loss_terms import term_words
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.data import TrainData
from draftdeck.drafter.train.drafters import DRAFTER_JSON, config_json
from draftdeck.drafter.train.memory import MemoryEstimate, Shapes
from draftdeck.drafter.train.optimizers import state_bytes
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.sharding import Sharding
from draftdeck.drafter.train.truth import Batch


def step_weights(beta: float, steps: int) -> list[float]:
    """Step k's loss weight: beta^k / sum_j beta^j (speculators' `compute_step_weights`, FastMTP eq. 2)."""
    raw = [beta**k for k in range(steps)]
    return [w / sum(raw) for w in raw]


class MTPKind(UnrolledChain):
    """The target's MTP layer, fine-tuned: every position of every row, `mtp_steps` unrolled steps
    through EAGLE-3's objective and walk (UnrolledChain)."""

    name = "mtp"

    def __init__(self, params: TrainParams, target: Target, data: TrainData):
        self.p = params
        self.target_folder = Path(params.target)
        self.model: MTPDrafter = from_target(self.target_folder, target.config).share_head(target.lm_head)
        self.cfg: MTPConfig = self.model.config
        self.slots = params.mtp_steps + 1
        self.layer_ids = self.cfg.target_layer_ids
        self.steps, self.decay = params.mtp_steps, params.mtp_step_beta

    def fresh(self) -> nn.Module:
        return MTPDrafter(self.cfg).share_head(self.model.head)  # type: ignore[arg-type]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "mtp",
            **self.cfg.to_dict(),
            "mtp_steps": self.p.mtp_steps,
            "mtp_step_beta": self.p.mtp_step_beta,
            "step_weights": step_weights(self.p.mtp_step_beta, self.p.mtp_steps),
            "from": str(self.target_folder),
        }

    def summary(self) -> str:
        return (
            f"drafter: the target's own MTP layer (from {self.target_folder}), fine-tuned over"
            f" {self.p.mtp_steps} unrolled steps, the target frozen"
        )

    def shard(self, strategy: Sharding, why: str, device: torch.device, world: int) -> str:
        if strategy == "none":
            return why
        return f"{why}; the MTP layer is whole on every rank, its gradients summed"

    def estimate(
        self, shapes: Shapes, target_config: object, *, held: int, capacity: int | None
    ) -> MemoryEstimate:
        return estimate_mtp(self.cfg, target_config, self.model, shapes, self.p.mtp_steps, held, capacity)

    def loss_formula(self) -> str:
        mix = self.p.mix
        parts = [
            f"{mix.ce:g} x CE(data's token)" if mix.ce else "",
            f"{mix.kl:g} x KL(target || MTP layer)" if mix.kl else "",
            *(f"{w:g} x {term_words(mix)[n]}" for n, w in mix.others),
        ]
        body = " + ".join(p for p in parts if p)
        beta = self.p.mtp_step_beta
        return (
            f"sum_k {beta:g}^k x ({body}) over unrolled steps k = 0..{self.p.mtp_steps - 1}, over the"
            " target's vocabulary, / sum of weights (speculators' step weights, normalised)"
        )

    def heldout(
        self, model: nn.Module, target: Target, batches: list[Batch], sources: Sequence[Sequence[str]],
        judge: bool, sample: bool, attention: Backend,
    ) -> tuple[Counts, dict[str, Counts]]:  # fmt: skip
        drafter: MTPDrafter = model  # type: ignore[assignment]
        drafter.share_head(target.lm_head)
        return super().heldout(drafter, target, batches, sources, judge, sample, attention)

    def config_files(self) -> dict[str, bytes]:
        """speculators' config.json (a checkpoint's weights are that format's, naming the target it was
        read from as the verifier), and ours with the training's shape."""
        from draftdeck.drafter.export.verifier import architectures_of
        from draftdeck.drafter.kinds.base import Verifier

        folder = str(self.target_folder)
        verifier = Verifier(folder, architectures_of(folder))
        return {
            "config.json": config_json(speculators_config(self.cfg, self.p.mtp_steps, verifier)),
            DRAFTER_JSON: config_json(self.describe()),
        }

    def check_resume(self, state: dict[str, torch.Tensor]) -> None:
        return None  # the layer's shape is the target's: load_state_dict checks every key and shape


def estimate_mtp(
    cfg: MTPConfig, target_config: object, drafter: nn.Module, shapes: Shapes, steps: int, held: int,
    capacity: int | None,
) -> MemoryEstimate:  # fmt: skip
    """An MTP run's peak: the target's forward, then `steps` unrolled passes of one layer over every
    position, each keeping its activations, its attention's probabilities and its logits over the
    whole vocabulary for the backward (EAGLE-3's training-time test over a full draft vocabulary)."""
    e, t = shapes.element_size, shapes.longest
    h, inter, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv, heads = cfg.num_key_value_heads * cfg.head_dim, cfg.num_attention_heads
    layers_t = int(getattr(target_config, "num_hidden_layers", cfg.num_target_layers))
    n_params = sum(p.numel() for p in drafter.parameters())
    optimizer = (n_params * 4 + state_bytes(drafter, shapes.optimizer)) // shapes.state_shards

    def work(bsz: int, grad: bool) -> dict[str, int]:
        q = bsz * t
        layer = e * (16 * q * h + 8 * q * kv + 5 * q * inter) if grad else e * (5 * q * h + 3 * q * inter)
        tile = t if grad else min(t, 512)
        per_step = layer + bsz * heads * tile * (t + steps) * (4 + e) + q * v * 4 * (2 if grad else 1)
        return {
            "optimizer": optimizer,
            "target forward": q * e * (h * (layers_t + 1) + 3 * inter),
            "target's view": q * v * 4 * 2,
            "unrolled steps": (steps if grad else 1) * per_step,
        }

    train = work(shapes.batch_size, True)
    phases = {"training step": held + sum(train.values())}
    heldout = work(max(1, shapes.eval_batch_size), False)
    if shapes.eval_batch_size:
        phases["held-out pass"] = held + sum(heldout.values())
    phase = max(phases, key=lambda k: phases[k])
    return MemoryEstimate(held, train if phase == "training step" else heldout, phase, capacity, phases)
