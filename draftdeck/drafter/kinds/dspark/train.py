"""What the trainer does for a DSpark drafter: DFlash's (draftdeck.drafter.kinds.dflash.train), with
the drafter's heads, the target's distribution read at every slot (the confidence head's label is the
slot's acceptance sum min(p, q)), a warm start from a DFlash run, and its config in speculators' format."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from draftdeck.drafter.kinds.dflash.train import DFlashKind
from draftdeck.drafter.kinds.dspark.export import config_json, warm_start
from draftdeck.drafter.kinds.dspark.model import DSparkConfig, DSparkDrafter
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.drafters import DRAFTER_JSON
from draftdeck.drafter.train.drafters import config_json as json_bytes
from draftdeck.drafter.train.params import TrainParams


class DSparkKind(DFlashKind):
    name = "dspark"

    model: DSparkDrafter

    def __init__(self, params: TrainParams, target: Target):
        super().__init__(params, target)
        self.teacher_always = self.dspark.confidence_head
        self.model.confidence_weight = params.confidence_weight
        self.started_from = warm_start(self.model, Path(params.init_from)) if params.init_from else None

    def config_of(self, shape: DrafterConfig) -> DSparkConfig:
        p = self.p
        return DSparkConfig(
            **{k: v for k, v in asdict(shape).items()},
            markov_rank=p.markov_rank,
            markov_head_type=p.markov_head,
            confidence_head=p.confidence_head,
            confidence_with_markov=p.markov_rank > 0,
            sample_from_anchor=p.sample_from_anchor,
        )

    @property
    def dspark(self) -> DSparkConfig:
        assert isinstance(self.cfg, DSparkConfig)
        return self.cfg

    def fresh(self) -> DSparkDrafter:
        return DSparkDrafter(self.dspark)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, **self.cfg.to_dict(), "started_from": self.started_from}

    def summary(self) -> str:
        c = self.dspark
        drafts = c.block_size if c.sample_from_anchor else c.block_size - 1
        heads = [
            f"Markov head {c.markov_head_type} (rank {c.markov_rank})" if c.markov_rank else "no Markov head"
        ]
        heads.append("a confidence head" if c.confidence_head else "no confidence head")
        where = "from the anchor" if c.sample_from_anchor else "after the anchor"
        return (
            f"drafter: DSpark, {c.layers} layer{'s' if c.layers > 1 else ''}, blocks of {c.block_size}"
            f" drafting {drafts} tokens {where}, {' and '.join(heads)}"
            + (f"; {self.started_from}" if self.started_from else "")
        )

    def loss_formula(self) -> str:
        base = super().loss_formula().replace("dflash:", "dspark:", 1)
        if self.dspark.confidence_head:
            base += (
                f" + {self.p.confidence_weight:g} x sum_k w_k BCE(confidence_k, sum min(p, q)_k) / sum_k w_k"
            )
        return base

    def config_files(self) -> dict[str, bytes]:
        return {
            "config.json": json_bytes(config_json(self.dspark)),
            DRAFTER_JSON: json_bytes(self.describe()),
        }
