"""COD sampling (Conditional-On-Distribution; speculators' `generate_cod_sample_indices`): which chains a
P-EAGLE training step computes at each depth, so that its memory does not grow with the depths K.

Depth 0 keeps every position of a row (its keys are every chain's context). Of the n positions whose
depth-0 label is trained, depth d >= 1 keeps int((n - d) * max(r^d, r_min)) chains, drawn at random
from the chains kept at depth d - 1 whose depth-d label is trained (all of them when there are fewer):
a chain kept at depth d is kept at every depth below, as the drafter's attention over its own chain
needs (`PEagleDrafter.parallel`). r is `down_sample_ratio`, r_min `down_sample_ratio_min`; a depth
that keeps none ends the sampling. In speculators' form the pool of depth d is the previous depth's
positions shifted by one and filtered by the loss mask; here positions are the chains' anchors and the
filter is the depth's own label (`depth_labels`), the same chains.
"""

from __future__ import annotations

import torch


def cod_sample(
    counted: torch.Tensor, ratio: float, ratio_min: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(K, T) bool: depth d keeps the chain at anchor t. `counted` (K, T): depth d's label at t is
    trained (`depth_labels` over every anchor)."""
    depths = counted.shape[0]
    kept = torch.zeros_like(counted, dtype=torch.bool)
    kept[0] = True
    n = int(counted[0].sum())
    for d in range(1, depths):
        size = int(max(0, n - d) * max(ratio**d, ratio_min))
        pool = (kept[d - 1] & counted[d]).nonzero()[:, 0]
        if size <= 0 or pool.numel() == 0:
            break
        if pool.numel() > size:
            pick = torch.randperm(pool.numel(), generator=generator, device="cpu")[:size]
            pool = pool[pick.to(pool.device)]
        kept[d, pool] = True
    return kept


def kept_anchors(kept: torch.Tensor) -> list[torch.Tensor]:
    """Each depth's kept anchors (bsz, n_d), ascending, a row's padding T, from `kept` (bsz, K, T);
    up to the last depth any row keeps."""
    _, depths, t = kept.shape
    out = []
    for d in range(depths):
        rows = kept[:, d]
        n = int(rows.sum(dim=1).max())
        if n == 0:
            break
        # kept positions first, in order (a stable sort of "not kept"), then T for the rest
        order = torch.sort((~rows).to(torch.int8), dim=1, stable=True).indices[:, :n]
        pos = torch.where(rows.gather(1, order), order, torch.full_like(order, t))
        out.append(pos)
    return out
