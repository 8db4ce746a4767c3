"""What the trainer does for a DFlash2 drafter: DFlash's (draftdeck.drafter.kinds.dflash.train), with
its convolutions and candidate selector and its config in speculators' format."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from draftdeck.drafter.kinds.dflash.train import DFlashKind
from draftdeck.drafter.kinds.dflash2.export import config_json
from draftdeck.drafter.kinds.dflash2.model import DFlash2Config, DFlash2Drafter
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.drafters import DRAFTER_JSON
from draftdeck.drafter.train.drafters import config_json as json_bytes
from draftdeck.drafter.train.params import TrainParams


class DFlash2Kind(DFlashKind):
    name = "dflash2"
    model: DFlash2Drafter

    def __init__(self, params: TrainParams, target: Target):
        super().__init__(params, target)
        self.model.selector_weight = params.selector_weight

    def config_of(self, shape: DrafterConfig) -> DFlash2Config:
        p = self.p
        return DFlash2Config(
            **asdict(shape),
            conv_kernel_size=p.conv_kernel_size,
            conv_group_size=p.conv_group_size,
            selector_rank=p.selector_rank,
            selector_top_k=p.selector_top_k,
        )

    @property
    def dflash2(self) -> DFlash2Config:
        assert isinstance(self.cfg, DFlash2Config)
        return self.cfg

    def fresh(self) -> DFlash2Drafter:
        return DFlash2Drafter(self.dflash2)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, **self.cfg.to_dict()}

    def summary(self) -> str:
        c = self.dflash2
        return (
            f"drafter: DFlash2, {c.layers} layer{'s' if c.layers > 1 else ''}, blocks of {c.block_size},"
            f" convolutions of {c.conv_kernel_size} taps over groups of {c.conv_group_size} channels,"
            f" a selector reranking the top {c.selector_top_k} (rank {c.selector_rank})"
        )

    def loss_formula(self) -> str:
        base = super().loss_formula().replace("dflash:", "dflash2:", 1)
        return f"{base} + {self.p.selector_weight:g} x sum_k w_k CE(selector over the top-k)_k / sum_k w_k"

    def config_files(self) -> dict[str, bytes]:
        return {
            "config.json": json_bytes(config_json(self.dflash2)),
            DRAFTER_JSON: json_bytes(self.describe()),
        }
