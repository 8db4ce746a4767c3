"""The options of a P-EAGLE drafter beside EAGLE-3's draft vocabulary and tapped layers: the parallel
positions a forward drafts (K, speculators' `num_depths`) and COD sampling's retention of each depth
(`down_sample_ratio`, `down_sample_ratio_min`, speculators' names and defaults). Defined once: the train
job's parameters, its form, CLI and API take them from here (draftdeck.drafter.kinds.Options)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from draftdeck.drafter.kinds.base import KindOptions


class PEagleOptions(KindOptions):
    title: ClassVar[str] = "P-EAGLE"

    num_depths: int = Field(
        8, ge=1, le=32,
        description="P-EAGLE: positions drafted in one forward (K, the drafts a verify step proposes)",
    )  # fmt: skip
    down_sample_ratio: float = Field(
        0.7, gt=0, le=1,
        description="P-EAGLE: COD sampling keeps a share r^d of the positions at depth d (speculators: 0.7)",
    )  # fmt: skip
    down_sample_ratio_min: float = Field(
        0.2, ge=0, le=1,
        description="P-EAGLE: the least share COD sampling keeps at any depth (speculators: 0.2)",
    )  # fmt: skip
