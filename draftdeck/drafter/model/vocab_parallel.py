"""The frozen target's embedding and LM head split by vocabulary across the ranks (vocabulary
parallelism, as Megatron's parallel embedding and cross-entropy): rank r holds the rows of ids
[r * S, (r + 1) * S), S = ceil(V / N), of each. With the decoder layers sharded by FSDP, a rank then
holds 1/N of the whole target plus the layer in flight: 5 GB of a 27B target's 54 are its 248K-row
embedding and head, which the drafter reads at every slot of every step, so gathering them (as FSDP
would) would hold them whole for the whole step.

Every use is a collective, so every rank makes the same calls, in one of two ways (`VocabShard`):
- the ranks hold different rows (a training step, each rank its share of the batch): the rows are
  gathered from every rank (padded to the most), each rank computes its slice of the vocabulary for
  all of them, and each gets back its own rows' results (a reduce-scatter);
- the ranks hold the same rows (`same_rows()`: the pre-flight and the held-out pass, which under
  fsdp run every row on every rank): nothing is gathered, partial results are summed.

Reductions over the vocabulary: log-sum-exp (the max, then the sum of exp below it), argmax (the
largest value; on a tie the lowest id, as `torch.argmax`), sums (a label's logit from its owner, a
row's KL and acceptance sums). `draftdeck.drafter.model.head` computes the loss through either head,
a whole one or a shard, with the same code.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class WholeVocab:
    """The reductions over a vocabulary one rank holds whole: each is the plain operation."""

    start = 0

    def lse(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(logits, dim=-1)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)

    def pick(self, values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(N,) values[i, ids[i]]."""
        return values.gather(1, ids[:, None])[:, 0]

    def sum(self, partial: torch.Tensor) -> torch.Tensor:
        return partial

    def sub_at(self, g: torch.Tensor, ids: torch.Tensor, value: float) -> None:
        """g[i, ids[i]] -= value, in place."""
        g[torch.arange(g.shape[0], device=g.device), ids] -= value


class VocabShard(WholeVocab):
    """This rank's slice of a vocabulary of `vocab` ids over `world` ranks: ids [start, stop)."""

    def __init__(self, vocab: int, rank: int, world: int):
        if vocab < world:
            raise ValueError(f"a vocabulary of {vocab} ids cannot be split over {world} ranks")
        self.vocab, self.rank, self.world = vocab, rank, world
        self.size = math.ceil(vocab / world)  # the rows a rank's slice has room for
        self.start = min(vocab, rank * self.size)
        self.stop = min(vocab, self.start + self.size)
        self.shared = False  # the ranks hold the same rows (`same_rows`)

    @contextmanager
    def same_rows(self) -> Iterator[None]:
        """Within it every rank passes the same rows: nothing is gathered. The default (different
        rows) is the safe one: the same rows gathered give the same results, N times the work."""
        before, self.shared = self.shared, True
        try:
            yield
        finally:
            self.shared = before

    # --- over the vocabulary -----------------------------------------------------------------
    def lse(self, logits: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        top = logits.max(-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        below = (logits - top[:, None]).exp().sum(-1)
        dist.all_reduce(below)
        return top + below.log()

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        value, index = logits.max(-1)  # the first maximum in this slice
        every = _gather(torch.stack([value.double(), (index + self.start).double()]), self.world)
        best = every[:, 0].argmax(0)  # the first rank with the largest value: the lowest id on a tie
        return every[:, 1].gather(0, best[None])[0].long()

    def pick(self, values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        local, mine = self._local(ids)
        return self.sum(torch.where(mine, values.gather(1, local[:, None])[:, 0], 0.0))

    def sum(self, partial: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(partial)
        return partial

    def sub_at(self, g: torch.Tensor, ids: torch.Tensor, value: float) -> None:
        local, mine = self._local(ids)
        rows = torch.arange(g.shape[0], device=g.device)[mine]
        g[rows, local[mine]] -= value

    def _local(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids - start clamped into the slice, whether this rank holds each id)."""
        mine = (ids >= self.start) & (ids < self.stop)
        return (ids - self.start).clamp(0, max(self.stop - self.start - 1, 0)), mine

    # --- over the rows -----------------------------------------------------------------------
    def calls(self, n: int, device: torch.device) -> int:
        """The head or embedding calls every rank makes, each of which is a collective: the most any
        rank needs (`n` on this one); with the same rows, `n` itself."""
        import torch.distributed as dist

        if self.shared:
            return n
        most = torch.tensor([n], device=device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most)

    def gather_rows(self, x: torch.Tensor, fill: float = 0) -> tuple[torch.Tensor, int]:
        """(every rank's rows of `x` (n, ...) one after the other, each rank's padded with `fill` to
        the most any rank has: (N * m, ...), m); with the same rows: `x` itself and its length."""
        import torch.distributed as dist

        if self.shared:
            return x, x.shape[0]
        most = torch.tensor([x.shape[0]], device=x.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        m = int(most)
        padded = x.new_full((m, *x.shape[1:]), fill)
        padded[: x.shape[0]] = x
        return _gather(padded, self.world).flatten(0, 1), m

    def own_rows(self, every: torch.Tensor, m: int, n: int) -> torch.Tensor:
        """This rank's `n` rows of a result over `gather_rows`' rows."""
        return every if self.shared else every[self.rank * m : self.rank * m + n]

    def sum_rows(self, partial: torch.Tensor, m: int, n: int) -> torch.Tensor:
        """This rank's `n` rows of the sum over ranks of `partial` (over `gather_rows`' rows)."""
        import torch.distributed as dist

        if self.shared:
            dist.all_reduce(partial)
            return partial
        out = partial.new_empty((m, *partial.shape[1:]))
        dist.reduce_scatter_single(out, partial.contiguous())
        return out[:n]


class ShardedEmbedding(nn.Module):
    """`full`'s rows of this rank's slice; `forward` is `full`'s (its scale kept: Gemma's scaled
    embedding), `lookup` the bare rows (what `F.embedding(ids, full.weight)` gives)."""

    def __init__(self, full: nn.Embedding, shard: VocabShard):
        super().__init__()
        self.shard = shard
        self.num_embeddings, self.embedding_dim = full.num_embeddings, full.embedding_dim
        self.weight = _slice(full.weight, shard)
        scale = getattr(full, "embed_scale", None)
        self.scale = None if scale is None else float(scale)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        shard = self.shard
        flat, m = shard.gather_rows(ids.reshape(-1))
        local, mine = shard._local(flat)
        rows = F.embedding(local, self.weight) * mine[:, None].to(self.weight.dtype)
        return shard.sum_rows(rows, m, ids.numel()).view(*ids.shape, -1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.lookup(ids)
        return out if self.scale is None else out * torch.tensor(self.scale, dtype=out.dtype)


class ShardedHead(nn.Module):
    """`full`'s rows (a bias-free `nn.Linear`) of this rank's slice; `forward` gives the whole
    logits of its rows (every slice gathered: for the model's own forward and generation, a few
    positions); the loss and the argmax go through `draftdeck.drafter.model.head` slice by slice."""

    def __init__(self, full: nn.Linear, shard: VocabShard, weight: nn.Parameter | None = None):
        super().__init__()
        self.shard = shard
        self.in_features, self.out_features = full.in_features, full.out_features
        if weight is None:  # tied to the embedding: the same slice, held once
            weight = _slice(full.weight, shard)
        self.weight = weight
        self.bias = None

    @property
    def local_vocab(self) -> int:
        return int(self.weight.shape[0])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shard = self.shard
        rows = hidden.reshape(-1, hidden.shape[-1])
        every, m = shard.gather_rows(rows)
        logits = rows.new_zeros((every.shape[0], shard.size))
        logits[:, : self.local_vocab] = F.linear(every, self.weight)
        slices = _gather(logits, shard.world)
        whole = slices.permute(1, 0, 2).reshape(every.shape[0], -1)[:, : shard.vocab]
        return shard.own_rows(whole, m, rows.shape[0]).view(*hidden.shape[:-1], shard.vocab)


def _slice(weight: torch.Tensor, shard: VocabShard) -> nn.Parameter:
    """This rank's rows of a frozen (V, H) weight, a copy: the whole one can be freed."""
    return nn.Parameter(weight.detach()[shard.start : shard.stop].clone(), requires_grad=False)


def _gather(x: torch.Tensor, world: int) -> torch.Tensor:
    """(world, *x.shape): every rank's `x` (the same shape on each)."""
    import torch.distributed as dist

    every = x.new_empty((world * x.shape[0], *x.shape[1:]))
    dist.all_gather_single(every, x.contiguous())
    return every.view(world, *x.shape)


def shard_vocab(model: Any, rank: int, world: int) -> VocabShard | None:
    """Replace `model`'s input embedding and LM head by this rank's slices; None (and nothing
    changed) when they are not a plain `nn.Embedding` and a bias-free `nn.Linear` of one vocabulary."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if not (
        isinstance(emb, nn.Embedding)
        and isinstance(head, nn.Linear)
        and head.bias is None
        and head.out_features == emb.num_embeddings
    ):
        return None
    shard = VocabShard(emb.num_embeddings, rank, world)
    tied = head.weight is emb.weight
    sharded_emb = ShardedEmbedding(emb, shard)
    sharded_head = ShardedHead(head, shard, sharded_emb.weight if tied else None)
    model.set_input_embeddings(sharded_emb)
    model.set_output_embeddings(sharded_head)
    return shard


def embed_rows(embedding: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The bare embedding rows of `ids` (no scale), from a whole or a sharded embedding."""
    if isinstance(embedding, ShardedEmbedding):
        return embedding.lookup(ids)
    assert isinstance(embedding, nn.Embedding)
    return F.embedding(ids, embedding.weight)
