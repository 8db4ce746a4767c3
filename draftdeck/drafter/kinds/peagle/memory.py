"""A P-EAGLE run's working set (draftdeck.drafter.train.memory asks it before step 1)."""

from __future__ import annotations

import math

from torch import nn

from draftdeck.drafter.kinds.eagle3.memory import estimate_eagle3
from draftdeck.drafter.kinds.peagle.model import PEagleConfig
from draftdeck.drafter.train.memory import MemoryEstimate, Shapes


def kept_share(depths: int, ratio: float, ratio_min: float) -> float:
    """The positions COD sampling computes, in rows' worth: depth 0 whole, depth d a share
    max(r^d, r_min) of it (`cod.cod_sample`)."""
    return 1 + sum(max(ratio**d, ratio_min) for d in range(1, depths))


def estimate_peagle(
    cfg: PEagleConfig,
    target_config: object,
    drafter: nn.Module,
    shapes: Shapes,
    ratios: tuple[float, float],
    *,
    held: int,
    capacity: int | None,
) -> MemoryEstimate:
    """EAGLE-3's estimate (its terms named for TTT steps) with as many steps as rows' worth of positions
    COD sampling keeps: each kept depth's queries attend over the row as a TTT step's do, and autograd
    keeps them all. A depth adds max(r^d, r_min) of a row, not a whole row as a TTT step does."""
    steps = math.ceil(kept_share(cfg.num_depths, *ratios))
    return estimate_eagle3(cfg, target_config, drafter, shapes, steps, held=held, capacity=capacity)
