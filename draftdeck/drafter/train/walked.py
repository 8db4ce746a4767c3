"""The walked tau: acceptance measured the way decoding walks, over one teacher-forced pass.

Every kind walks the same way (`walk_steps` over the runs its drafts give at each anchor) and tallies
a batch's walk alike (`tally`); how the runs are read is the kind's (its package's walked.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from draftdeck.drafter.model.target import Target, TargetPass
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.truth import Batch, agreement_of, target_view


def spans(loss_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the maximal runs of 1 in a (bsz, T) mask, as flat indices into the
    row-major array; ends are inclusive."""
    m = np.asarray(loss_mask, dtype=bool)
    bsz, t = m.shape
    padded = np.zeros((bsz, t + 2), dtype=bool)
    padded[:, 1:-1] = m
    d = np.diff(padded.astype(np.int8), axis=1)
    rs, cs = np.nonzero(d == 1)
    re_, ce = np.nonzero(d == -1)
    return rs * t + cs, re_ * t + ce - 1


@dataclass
class Walk:
    """The verify steps of a walk over a batch: each step's row and its accepted drafts."""

    rows: np.ndarray
    accepted: np.ndarray

    def counts(self, block_size: int, rows: np.ndarray | None = None) -> Counts:
        """The walked counts of every row, or of the rows where `rows` (bsz,) is True."""
        acc = self.accepted if rows is None else self.accepted[rows[self.rows]]
        c = Counts(block_size)
        c.walked_accepted, c.walked_steps = int(acc.sum()), int(acc.size)
        c.walked_hist = [int(x) for x in np.bincount(acc + 1, minlength=block_size + 1)]
        return c


RunsAt = Callable[[np.ndarray], np.ndarray]  # flat positions -> the run of the block drafted at each


def walk_steps(runs_at: RunsAt, loss_mask: np.ndarray) -> Walk:
    """Walk every span of `loss_mask` (bsz, T), all spans a step at a time: `runs_at` gives the
    leading correct run of the block anchored at each position the walk visits (each an eligible
    anchor)."""
    t = np.asarray(loss_mask).shape[1]
    start, end = spans(loss_mask)
    p, e = start.copy(), end
    rows, accepted = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    active = p < e
    while active.any():
        pa, ea = p[active], e[active]
        acc = np.minimum(np.asarray(runs_at(pa), dtype=np.int64), ea - pa)
        rows.append(pa // t)
        accepted.append(acc)
        p[active] = pa + 1 + acc
        active = p < e
    return Walk(np.concatenate(rows), np.concatenate(accepted))


def drafted_runs(runs: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """`runs` (the runs at `positions`), refusing a position where no block was drafted (-1)."""
    if (runs < 0).any():
        missing = int(positions[runs < 0][0])
        raise ValueError(f"the walk reached a position with no draft (flat index {missing})")
    return runs


def known_runs(runs: np.ndarray) -> RunsAt:
    """`runs_at` over `runs` (bsz, T) known at every position the walk may reach (-1: none drafted)."""
    flat = np.asarray(runs, dtype=np.int64).reshape(-1)
    return lambda positions: drafted_runs(flat[positions], positions)


def walk(runs: np.ndarray, loss_mask: np.ndarray, block_size: int) -> Counts:
    """The walked counts over `runs` (bsz, T), known at every eligible anchor."""
    return walk_steps(known_runs(runs), loss_mask).counts(block_size)


def row_generators(input_ids: torch.Tensor, lengths: Sequence[int], seed: int) -> list[torch.Generator]:
    """A generator per row, seeded by `seed` and the row's tokens (not its batch, rank or padding)."""
    gens = []
    for row, n in zip(input_ids.cpu().numpy(), lengths, strict=True):
        g = torch.Generator()
        g.manual_seed((seed * 1_000_003 + zlib.crc32(row[:n].tobytes())) % 2**63)
        gens.append(g)
    return gens


def tally(
    steps: Walk,
    target: Target,
    tf: TargetPass,
    batch: Batch,
    judge: bool,
    names: list[str],
    slots: int,
    by_source: dict[str, Counts],
) -> Counts:
    """A batch's walk as counts, with target agreement when `judge`, and its tokens; each row source's
    share of both added to `by_source` (`names`: each row's source, or none)."""
    input_ids, attention_mask, loss_mask = batch
    view = (
        target_view(target.lm_head, tf.last_hidden, tf.last_logits, input_ids, loss_mask) if judge else None
    )
    w = steps.counts(slots)
    if view is not None:
        w.add_agreement(agreement_of(view, input_ids))
    w.tokens = int(attention_mask.sum()) if attention_mask is not None else input_ids.numel()
    for name in sorted(set(names)):
        pick = np.asarray([n == name for n in names])
        sub = steps.counts(slots, pick)
        if view is not None:
            sub.add_agreement(agreement_of(view, input_ids, torch.from_numpy(pick).to(input_ids.device)))
        by_source[name] = by_source[name] + sub if name in by_source else sub
    return w
