"""The options of a DFlash-family drafter (DFlash, and the kinds that extend it): its block, layers,
tapped target layers, mask id, slot decay and anchors. Defined once: the train job's parameters, its
form, CLI and API take them from here (draftdeck.drafter.kinds.Options)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from draftdeck.drafter.kinds.base import KindOptions

DEFAULT_DPACE_ALPHA = 0.5  # speculators' default (`dpace_alpha`), as SpecForge's and D-PACE's examples
DEFAULT_EXP_DECAY = 1.0  # speculators' default for exp_loss_decay (`--ttt-step-loss-decay`)


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
    position_weights: Literal["dflash", "exp", "dpace"] = Field(
        "dflash",
        description="How much each drafted slot weighs in the loss: dflash = exp(-(k-1)/gamma); exp ="
        " exp_decay^k (speculators' exp_loss_decay); dpace = D-PACE: from each slot's CE in the step's"
        " forward, sum over the block's later slots of the cumulative smoothed confidence, one more head"
        " pass without gradients (block kinds only: EAGLE-3 weighs its steps by step_decay)",
    )
    exp_decay: float = Field(
        DEFAULT_EXP_DECAY, gt=0, le=1, description="position_weights exp: w_k = exp_decay^k (1: all alike)"
    )
    dpace_alpha: float = Field(
        DEFAULT_DPACE_ALPHA,
        gt=0,
        le=1,
        description="position_weights dpace: confidence smoothing, q' = (1 - alpha) exp(-CE) + alpha"
        " (speculators' default 0.5)",
    )
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

    @model_validator(mode="after")
    def _weights_read(self) -> DFlashOptions:
        """exp_decay and dpace_alpha are read by their scheme only: given with another, refused."""
        for name, scheme in (("exp_decay", "exp"), ("dpace_alpha", "dpace")):
            default = type(self).model_fields[name].default
            if self.position_weights != scheme and getattr(self, name) != default:
                raise ValueError(
                    f"{name}: read with position_weights {scheme} only (this run's: {self.position_weights})"
                )
        return self
