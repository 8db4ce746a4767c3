"""How much each drafted slot of a block weighs in the loss (`--position-weights`), for the DFlash family.

With k the slot's index in the verify block (slot 0 the anchor, never counted):

- `dflash` (the default, DFlash's): w_k = exp(-(k - 1) / gamma); the loss is sum w * loss / sum w.
- `exp` (speculators' `exp_loss_decay`, `gamma ** pos_idx`): w_k = exp_decay^k; the same normaliser.
  After it the two differ only in how the decay is named: `dflash` with gamma is `exp` with
  exp_decay = exp(-1 / gamma). speculators' default exp_decay, 1.0, weighs every slot alike.
- `dpace` (D-PACE, speculators' `dpace_loss_decay` in `losses/utils.py`): from each slot's
  cross-entropy in the current forward, under no_grad, q_k = exp(-CE_k) (the drafter's probability of
  the slot's token), smoothed q'_k = (1 - alpha) q_k + alpha (1 at a slot not counted, which passes
  the product through), P_k = q'_1 ... q'_k (the block accepted up to k), and
  w_k = (P_k + P_{k+1} + ... + P_last) over the counted slots, 0 at a slot not counted: a slot weighs
  what its acceptance is worth to the slots after it, little where its predecessors are likely
  rejected. The weights follow the drafter, so their sum is not known before the forward: the loss
  is sum w * loss / N, N the counted slots (speculators' denominator, `loss_mask.sum()`), which
  micro-batches and ranks still share before any forward.

D-PACE's CE comes from a pass through the head without gradients before the loss's own
(`objective.counted_slot_ce`): one more (N, V) matmul per counted slot, in the head's chunks (no
full-vocabulary logits held).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from draftdeck.drafter.kinds.dflash.options import DEFAULT_DPACE_ALPHA, DEFAULT_EXP_DECAY

Scheme = Literal["dflash", "exp", "dpace"]
SCHEMES: tuple[Scheme, ...] = ("dflash", "exp", "dpace")
DFLASH_WORDS = "w_k = exp(-(k-1)/gamma)"  # as `objective.loss_formula` writes today's weights


@dataclass(frozen=True)
class PositionWeights:
    """A run's position weights: `scheme` and the parameter each reads (`gamma` also weighs the
    held-out loss, whatever the scheme, so that runs of different schemes compare there)."""

    scheme: Scheme = "dflash"
    gamma: float = 7.0
    exp_decay: float = DEFAULT_EXP_DECAY
    dpace_alpha: float = DEFAULT_DPACE_ALPHA

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"position weights {self.scheme!r}: one of {', '.join(SCHEMES)}")
        if not math.isfinite(self.gamma) or self.gamma <= 0:
            raise ValueError(f"gamma {self.gamma} must be a positive number")
        if not 0 < self.exp_decay <= 1:
            raise ValueError(f"exp_decay {self.exp_decay} must be in (0, 1]")
        if not 0 < self.dpace_alpha <= 1:
            raise ValueError(f"dpace_alpha {self.dpace_alpha} must be in (0, 1]")

    @property
    def known_before_forward(self) -> bool:
        """Whether a slot's weight depends on its index only (not on the drafter's forward)."""
        return self.scheme != "dpace"

    def words(self) -> str:
        """The weights in words, as run.json's loss formula names them."""
        if self.scheme == "exp":
            return f"w_k = {self.exp_decay:g}^k"
        if self.scheme == "dpace":
            return (
                f"w_k = D-PACE(alpha={self.dpace_alpha:g}): sum_{{j>=k}} prod_{{i<=j}}"
                " ((1-alpha) exp(-CE_i) + alpha), no_grad"
            )
        return DFLASH_WORDS

    def formula(self, dflash_formula: str) -> str:
        """`objective.loss_formula`'s text (written for `dflash`) with these weights and normaliser."""
        if self.scheme == "dflash":
            return dflash_formula
        text = dflash_formula.replace(DFLASH_WORDS, self.words())
        if self.words() not in text:
            text += f"; {self.words()}"
        if self.scheme == "dpace":
            text = text.replace("/ sum_k w_k", "/ N_counted")
        return text


def as_position_weights(weights: float | PositionWeights) -> PositionWeights:
    """A bare number is DFlash's gamma (the objective's older form, kept by its tests and benchmarks)."""
    return weights if isinstance(weights, PositionWeights) else PositionWeights(gamma=float(weights))


def batch_normalizer(weights: float | PositionWeights, w: torch.Tensor) -> torch.Tensor:
    """The loss's denominator over one batch's counted slots, whose weights are `w` (N,): their sum,
    or D-PACE's, their number (`fixed_weights` says the same before the forward)."""
    if as_position_weights(weights).known_before_forward:
        return w.sum()
    return torch.tensor(float(w.numel()), device=w.device)


def dflash_weights(block_size: int, gamma: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """(B,) w_k = exp(-(k - 1) / gamma) for k >= 1, and 0 for the anchor slot."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def exp_weights(block_size: int, decay: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """(B,) w_k = decay^k (speculators' `exp_loss_decay`: gamma ** pos_idx), 0 for the anchor slot."""
    w = decay ** torch.arange(block_size, dtype=torch.float32, device=device)
    w[0] = 0.0
    return w


def fixed_weights(
    weights: PositionWeights, block_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(B,) the weight of each slot where it depends on the index only; for D-PACE, 1 per counted
    slot: what the normaliser, N, sums."""
    if weights.scheme == "exp":
        return exp_weights(block_size, weights.exp_decay, device)
    if weights.scheme == "dpace":
        w = torch.ones(block_size, dtype=torch.float32, device=device)
        w[0] = 0.0
        return w
    return dflash_weights(block_size, weights.gamma, device)


def dpace_weights(ce: torch.Tensor, counted: torch.Tensor, alpha: float) -> torch.Tensor:
    """(..., S) D-PACE's weights of blocks of S slots along the last dimension: `ce` each slot's
    cross-entropy (any value where not counted), `counted` (..., S) bool. speculators'
    `dpace_loss_decay`: smooth = (1 - alpha) exp(-CE) + alpha (1 where not counted), its cumulative
    product along the block, times the mask, summed from each slot to the block's end, times the mask."""
    with torch.no_grad():
        mask = counted.to(torch.float32)
        q = torch.exp(-ce.detach().float())
        smooth = torch.where(counted, (1.0 - alpha) * q + alpha, torch.ones_like(q))
        prefix = torch.cumprod(smooth, dim=-1) * mask
        suffix = prefix.flip(-1).cumsum(-1).flip(-1)
        return suffix * mask


def counted_weights(
    weights: float | PositionWeights, counted: torch.Tensor, slot_ce: Callable[[], torch.Tensor]
) -> torch.Tensor:
    """(N,) the weight of each counted slot (`counted`, a batch's (..., slots) mask), in the order of
    `counted.nonzero()`; `slot_ce` gives those slots' cross-entropy without gradients, asked for by
    D-PACE only (the objective's extra pass through the head)."""
    pw = as_position_weights(weights)
    if pw.known_before_forward:
        return fixed_weights(pw, counted.shape[-1], counted.device).expand_as(counted)[counted]
    ce = torch.zeros(counted.shape, dtype=torch.float32, device=counted.device)
    ce[counted] = slot_ce().float()
    return dpace_weights(ce, counted, pw.dpace_alpha)[counted]
