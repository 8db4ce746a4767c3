"""What the trainer does for a DFlash drafter (draftdeck.drafter.train.drafters.TrainKind)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from draftdeck.drafter.kinds.dflash.memory import estimate
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.objective import (
    dflash_backward,
    label_weight_sum,
    loss_formula,
    pad_anchors,
    sample_anchors_per_row,
)
from draftdeck.drafter.kinds.dflash.position_weights import PositionWeights
from draftdeck.drafter.kinds.dflash.walked import heldout_pass
from draftdeck.drafter.model.attention import Backend
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train import sharding
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.data import collate
from draftdeck.drafter.train.drafters import DRAFTER_JSON, MicroBatch, config_json
from draftdeck.drafter.train.memory import MemoryEstimate, Shapes
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.ranks import Ranks
from draftdeck.drafter.train.sharding import Sharding
from draftdeck.drafter.train.truth import Batch


class DFlashKind:
    """A DFlash drafter: blocks at sampled anchors, every layer's context keys once per micro-batch
    (`objective.dflash_backward`)."""

    name = "dflash"
    shards_state = True
    teacher_always = False  # the target's distribution read at every slot even without a KL loss

    def __init__(self, params: TrainParams, target: Target):
        self.p = params
        self.cfg = self.config_of(
            DrafterConfig.from_target(
                target.config, tokenizer=target.tokenizer, layers=params.layers, block_size=params.block_size,
                target_layer_ids=params.target_layer_ids, mask_token_id=params.mask_token_id,
            )
        )  # fmt: skip
        self.model = self.fresh()
        self.model.gradient_checkpointing = params.gradient_checkpointing
        self.slots = self.model.slots
        self.layer_ids = list(self.cfg.target_layer_ids)
        # the training loss's slot weights (`--position-weights`); the held-out loss keeps DFlash's gamma
        self.position_weights = PositionWeights(
            params.position_weights, params.gamma, params.exp_decay, params.dpace_alpha
        )

    def config_of(self, shape: DrafterConfig) -> DrafterConfig:
        """The drafter's config from the DFlash shape the target and options give (a kind that extends
        DFlash adds its own)."""
        return shape

    def fresh(self) -> DFlashDrafter:
        return DFlashDrafter(self.cfg)

    def describe(self) -> dict[str, Any]:
        return self.cfg.to_dict()

    def summary(self) -> str:
        layers = self.cfg.layers
        return f"drafter: DFlash, {layers} layer{'s' if layers > 1 else ''}, blocks of {self.cfg.block_size}"

    def shard(self, strategy: Sharding, why: str, device: torch.device, world: int) -> str:
        """Wrap the drafter for `strategy` (`sharding.shard`); the reason stands."""
        sharding.shard(self.model, strategy, device, world)
        return why

    def estimate(
        self, shapes: Shapes, target_config: object, *, held: int, capacity: int | None
    ) -> MemoryEstimate:
        return estimate(self.cfg, target_config, self.model, shapes, held=held, capacity=capacity)

    def loss_formula(self) -> str:
        return self.position_weights.formula(loss_formula(self.p.mix))

    def micro_batch(
        self, examples: list[Any], generators: list[torch.Generator], pad_id: int, device: torch.device
    ) -> MicroBatch:
        ids, att, lm = collate(examples, pad_id, device)
        anchors, valid = sample_anchors_per_row(
            lm, [len(e[0]) for e in examples], self.p.anchors_per_seq, generators
        )
        return MicroBatch(ids, att, lm, anchors, valid)

    def align(self, micro: list[MicroBatch], ranks: Ranks) -> list[MicroBatch]:
        """Every rank runs as many anchor groups (a sharded drafter's forward and backward are
        collectives): each micro-batch's anchors padded to the widest rank's."""
        widths = ranks.max([_anchors(m).shape[1] for m in micro])
        out = []
        for m, w in zip(micro, widths, strict=True):
            anchors, valid = pad_anchors(_anchors(m), _valid(m), w)
            out.append(MicroBatch(m.ids, m.att, m.lm, anchors, valid))
        return out

    def weight_sum(self, m: MicroBatch) -> float:
        return float(label_weight_sum(m.lm, _anchors(m), _valid(m), self.slots, self.position_weights))

    def backward(
        self, model: nn.Module, target: Target, m: MicroBatch, normalizer: float, attention: Backend
    ) -> Counts:
        mix, teacher = self.p.mix, None
        if mix.needs_teacher or self.teacher_always:  # the target's final hidden states: one forward
            tf = target.teacher_forced(m.ids, m.att, self.layer_ids)
            context, teacher = tf.context, tf.last_hidden
        else:
            _, context = target.context_features(m.ids, m.att, self.layer_ids)
        return dflash_backward(
            model, target.embedding, target.lm_head, context, m.ids, m.lm, m.att,  # type: ignore[arg-type]
            _anchors(m), _valid(m), self.position_weights, normalizer=normalizer,
            anchors_per_forward=self.p.anchors_per_forward, attention=attention, teacher=teacher, mix=mix,
        )  # fmt: skip

    def reduce_gradients(self, ranks: Ranks) -> None:
        """Nothing: FSDP2's hooks reduce a DFlash drafter's gradients (`sharding.shard`)."""

    def heldout(
        self, model: nn.Module, target: Target, batches: list[Batch], sources: Sequence[Sequence[str]],
        judge: bool, sample: bool, attention: Backend,
    ) -> tuple[Counts, dict[str, Counts]]:  # fmt: skip
        return heldout_pass(
            model, target, batches, self.p.gamma,  # type: ignore[arg-type]
            sources=sources, judge=judge, attention=attention, mix=self.p.mix,
            anchors_per_row=self.p.heldout_anchors if sample else 0, seed=self.p.seed,
        )  # fmt: skip

    def config_files(self) -> dict[str, bytes]:
        return {
            "config.json": config_json(self.cfg.to_hf_dict()),
            DRAFTER_JSON: config_json(self.cfg.to_dict()),
        }

    def check_resume(self, state: dict[str, torch.Tensor]) -> None:
        """Nothing beyond the weights' keys and shapes, which loading checks."""


def _anchors(m: MicroBatch) -> torch.Tensor:
    assert m.anchors is not None, "a DFlash micro-batch has anchors"
    return m.anchors


def _valid(m: MicroBatch) -> torch.Tensor:
    assert m.valid is not None, "a DFlash micro-batch has anchors"
    return m.valid
