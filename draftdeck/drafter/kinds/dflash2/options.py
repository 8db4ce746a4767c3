"""The options of a DFlash2 drafter beside the DFlash family's: its local convolutions and candidate
selector. Defined once: the train job's parameters, its form, CLI and API take them from here
(draftdeck.drafter.kinds.Options)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from draftdeck.drafter.kinds.base import KindOptions


class DFlash2Options(KindOptions):
    title: ClassVar[str] = "DFlash2"

    conv_kernel_size: int = Field(
        2, ge=1, le=64, description="DFlash2: causal taps of each local convolution over the block's slots"
    )
    conv_group_size: int = Field(
        16, ge=1, le=65536, description="DFlash2: channels sharing each convolution's predicted kernel"
    )
    selector_rank: int = Field(256, ge=1, le=4096, description="DFlash2: rank of the candidate selector")
    selector_top_k: int = Field(
        16, ge=1, le=1024, description="DFlash2: the head's top candidates the selector reranks per draft"
    )
    selector_weight: float = Field(
        1.0, ge=0, le=100, description="DFlash2: weight of the selector's loss beside the token loss"
    )
