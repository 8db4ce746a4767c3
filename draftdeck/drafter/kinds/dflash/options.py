"""The options of a DFlash-family drafter (DFlash, and the kinds that extend it): its block, layers,
tapped target layers, mask id, slot decay and anchors. Defined once: the train job's parameters, its
form, CLI and API take them from here (draftdeck.drafter.kinds.Options)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from draftdeck.drafter.kinds.base import KindOptions


class DFlashOptions(KindOptions):
    title: ClassVar[str] = "DFlash-family"

    block_size: int = Field(16, ge=2, le=64, description="DFlash block size B (anchor + B-1 drafted tokens)")
    layers: int = Field(1, ge=1, le=64, description="Drafter decoder layers (EAGLE-3's has one)")
    target_layer_ids: list[int] | None = Field(
        None, description="Target layers whose hidden states condition the drafter (default: spread 1..L-3)"
    )
    mask_token_id: int | None = Field(
        None, ge=0, description="Spare token id for masked slots (default: resolved)"
    )
    gamma: float = Field(7.0, gt=0, le=1000, description="Slot weight decay: w_k = exp(-(k-1)/gamma)")
    anchors_per_seq: int = Field(512, ge=1, le=8192, description="Random anchors (blocks) per sequence")
    anchors_per_forward: int = Field(
        32,
        ge=1,
        le=8192,
        description="Anchors per drafter forward and backward in training (more anchors go in several,"
        " for the same loss and gradients): lower it to trade time for memory on long rows",
    )
    heldout_anchors: int = Field(
        64,
        ge=1,
        le=8192,
        description="Anchors per held-out row whose every slot is read (the held-out loss, per-slot"
        " accuracy, expected acceptance, anchor-mean), seeded per row; the walked tau reads the blocks"
        " it reaches at every anchor",
    )
