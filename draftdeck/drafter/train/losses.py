"""What every drafter kind's objective shares: the mix of each drafted position's loss, and the runs of
correct drafts that a walk and the per-position counts read."""

from __future__ import annotations

import torch

Mix = tuple[float, float]  # (ce_weight, kl_weight) of each drafted position's loss
CE_ONLY: Mix = (1.0, 0.0)


def leading_runs(correct: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(bsz, A): number of consecutive correct slots from slot 1 (an uncounted slot ends the run);
    -1 for padded anchors."""
    run = correct[:, :, 1:].long().cumprod(dim=2).sum(dim=2)
    return torch.where(valid, run, torch.full_like(run, -1))
