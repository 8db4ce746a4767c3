"""What every drafter kind's objective shares beyond the loss mix (`draftdeck.drafter.model.loss_terms`):
the runs of correct drafts that a walk and the per-position counts read."""

from __future__ import annotations

import torch


def leading_runs(correct: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(bsz, A): number of consecutive correct slots from slot 1 (an uncounted slot ends the run);
    -1 for padded anchors."""
    run = correct[:, :, 1:].long().cumprod(dim=2).sum(dim=2)
    return torch.where(valid, run, torch.full_like(run, -1))
