"""What the ranks of a run agree on: sums of counts and flags (all_reduce SUM), maxima, gathered
per-source counts. With one rank every reduction is the value itself."""

from __future__ import annotations

from typing import Any

import torch

from draftdeck.drafter.train.counts import Counts


class Ranks:
    def __init__(self, rank: int, world: int, device: torch.device, block_size: int):
        self.rank, self.world, self.device, self.block_size = rank, world, device, block_size

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def max(self, values: list[int]) -> list[int]:
        """The elementwise maximum of `values` (the same length on every rank) over the ranks."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is True on any."""
        return bool(self.sum(torch.tensor([float(flag)], device=self.device)).item() > 0)

    def counts(self, c: Counts) -> Counts:
        if self.world == 1:
            return c
        ints, floats = c.to_tensors(self.device)
        return Counts.from_tensors(c.block_size, self.sum(ints).cpu(), self.sum(floats).cpu())

    def by_source(self, by: dict[str, Counts]) -> dict[str, Counts]:
        """Per-source counts summed over ranks (each rank holds the sources of its rows only)."""
        if self.world == 1:
            return by
        import torch.distributed as dist

        mine = {k: [t.tolist() for t in c.to_tensors()] for k, c in by.items()}
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, mine)
        out: dict[str, Counts] = {}
        for part in every:
            for k, (ints, floats) in part.items():
                c = Counts.from_tensors(self.block_size, torch.tensor(ints), torch.tensor(floats))
                out[k] = out[k] + c if k in out else c
        return out
