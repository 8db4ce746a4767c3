"""How many rows each source gives, from the recipe and the rows each one has left: exact integers.

- ``rows: N`` takes N; ``all`` takes every row left (after rejections, filters and duplicates).
- ``weight: W`` makes the source W of the mix's rows. Without a total the mix's size follows from
  the others: N = F / (1 - sum W), F the rows of the sources with rows or all; with only weights
  (summing to 1) it is the largest mix no source has to repeat rows for. With a total, the weighted
  sources take W of it and F plus theirs must come to the total.
- Shares become integers by largest remainder, so they add up exactly.
- A source asked for more rows than it has left is upsampled (its rows repeated), which the mix
  reports as a warning; one with no row left fails the mix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from draftdeck.errors import UsageError
from draftdeck.mix.recipe import Recipe


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split in proportion to `weights` into integers that sum to `total` (ties: the first)."""
    s = sum(weights)
    if total <= 0 or s <= 0:
        return [0] * len(weights)
    exact = [total * w / s for w in weights]
    out = [math.floor(x) for x in exact]
    left = total - sum(out)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[:left]:
        out[i] += 1
    return out


def plan_rows(recipe: Recipe, available: Sequence[int]) -> list[int]:
    """The rows each source of `recipe` gives, `available` the rows each has left (recipe order).

    Raises UsageError when the amounts cannot be met: a total that the fixed sources and the weights
    do not add up to, or a source asked for rows with none left."""
    sources = recipe.sources
    take = [0] * len(sources)
    weighted = [i for i, s in enumerate(sources) if s.weight is not None]
    for i, s in enumerate(sources):
        if s.rows is not None:
            take[i] = s.rows
        elif s.all:
            take[i] = available[i]
    fixed = sum(take)
    w = [float(sources[i].weight or 0) for i in weighted]
    share = sum(w)
    if weighted:
        if recipe.total is not None:
            n = recipe.total
            rest = n - fixed
            if rest < 0 or abs(share * n - rest) >= 1:
                raise UsageError(
                    f"the sources with rows or all give {fixed:,} rows and the weights ({share:g} in all)"
                    f" ask for {share * n:,.0f} of total {n:,}: {fixed:,} + {share * n:,.0f} is not {n:,};"
                    " leave total out (the weights are then shares of the mix the others make) or change"
                    " the weights"
                )
        elif fixed:
            rest = round(fixed / (1 - share)) - fixed
        else:  # only weights, summing to 1: the largest mix that repeats no row
            rest = min(math.floor(available[i] / wi) for i, wi in zip(weighted, w, strict=True))
        for i, k in zip(weighted, largest_remainder(rest, w), strict=True):
            take[i] = k
    elif recipe.total is not None and recipe.total != fixed:
        raise UsageError(
            f"total {recipe.total:,} is not the {fixed:,} rows the sources give; a total needs weights"
            " (shares of it) or must match"
        )
    for i, s in enumerate(sources):
        if take[i] and not available[i]:
            raise UsageError(
                f"source {s.name!r} ({s.amount}) has no row left to take after rejections, filters and"
                " duplicates"
            )
    return take
