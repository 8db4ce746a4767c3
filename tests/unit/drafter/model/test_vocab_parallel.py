"""The target's embedding and head split by vocabulary over 2 gloo ranks give what the whole ones
give: the loss and its parts, the gradient with respect to the hidden states, the argmax (the lowest
id on a tie), the embedding rows and the model's own logits; whether the ranks hold different rows
(gathered, each its own back) or the same ones (`same_rows`), a rank with no rows included; with the
mix's distribution losses (rkl, jsd, tv, nla, lk_hybrid) too, their row sums over the slices."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from draftdeck.drafter.kinds.eagle3.objective import target_draft_view
from draftdeck.drafter.model.head import head_argmax, head_loss
from draftdeck.drafter.model.loss_terms import Mix, parse_mix
from draftdeck.drafter.model.vocab_parallel import (
    ShardedEmbedding,
    ShardedHead,
    VocabShard,
    embed_rows,
    shard_vocab,
)

VOCAB, HIDDEN = 37, 16  # 19 ids on rank 0, 18 on rank 1
MIX = (0.5, 2.0)
EVERY_TERM = parse_mix("0.5*ce+kl+rkl+jsd+tv+nla+lk_hybrid")


def _rows(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, HIDDEN, generator=g)
    teacher = torch.randn(n, HIDDEN, generator=g)
    labels = torch.randint(0, VOCAB, (n,), generator=g)
    weights = torch.rand(n, generator=g) + 0.1
    return hidden, teacher, labels, weights


def _loss(
    head: nn.Module, rows: tuple[torch.Tensor, ...], mix: Mix | tuple[float, float] = MIX
) -> tuple[list[torch.Tensor], torch.Tensor]:
    hidden, teacher, labels, weights = rows
    h = hidden.clone().requires_grad_()
    # 3 rows a chunk (of the slice's 19 columns): several chunks, and a rank may have more than another
    alive = 8 if isinstance(mix, Mix) and mix.others else 3
    out = head_loss(head, h, labels, weights, teacher=teacher, mix=mix, chunk_bytes=4 * 19 * 3 * alive)
    out.total.backward()
    assert h.grad is not None
    parts = [out.total, out.ce, out.pred, out.kl, out.accept, out.target_pred, out.draft_prob, out.others]
    return [p.detach() for p in parts if p is not None], h.grad


def _same(
    got: tuple[list[torch.Tensor], torch.Tensor], want: tuple[list[torch.Tensor], torch.Tensor]
) -> None:
    assert len(got[0]) == len(want[0]) in (7, 8)
    for a, b in zip(got[0], want[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


def _rank(rank: int, world: int, store: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)  # the same whole modules on every rank
    head, emb = nn.Linear(HIDDEN, VOCAB, bias=False), nn.Embedding(VOCAB, HIDDEN)
    shard = VocabShard(VOCAB, rank, world)
    s_head, s_emb = ShardedHead(head, shard), ShardedEmbedding(emb, shard)
    assert (shard.start, shard.stop) == ((0, 19), (19, 37))[rank]
    assert s_head.weight.shape == (shard.stop - shard.start, HIDDEN)

    # different rows on each rank: 5 and 8 (and none on rank 0)
    for counts in ((5, 8), (0, 4)):
        mine = _rows(counts[rank], seed=10 + rank)
        _same(_loss(s_head, mine), _loss(head, mine))
        _same(_loss(s_head, mine, EVERY_TERM), _loss(head, mine, EVERY_TERM))
        assert torch.equal(head_argmax(s_head, mine[0]), head(mine[0]).argmax(-1))
        torch.testing.assert_close(s_head(mine[0]), head(mine[0]))
        # EAGLE-3's view of the target over a draft vocabulary: 3 rows a chunk, so the ranks need
        # different numbers of chunks, and each makes as many head calls (some empty)
        drafts = torch.tensor([0, 5, 20, 36])
        got = target_draft_view(s_head, mine[0][None], drafts, chunk_bytes=4 * VOCAB * 3)
        want = target_draft_view(head, mine[0][None], drafts, chunk_bytes=4 * VOCAB * 3)
        for a, b in ((got.logp, want.logp), (got.p, want.p), (got.greedy, want.greedy)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    ids = torch.randint(0, VOCAB, (2, 3 + rank), generator=torch.Generator().manual_seed(rank))
    torch.testing.assert_close(embed_rows(s_emb, ids), emb(ids))

    # the same rows on every rank: nothing gathered
    same = _rows(6, seed=99)
    with shard.same_rows():
        _same(_loss(s_head, same), _loss(head, same))
        assert torch.equal(head_argmax(s_head, same[0]), head(same[0]).argmax(-1))
        common = torch.arange(VOCAB).flip(0)
        torch.testing.assert_close(s_emb(common), emb(common))

    # a tie between the slices goes to the lowest id, as torch.argmax
    logits = torch.zeros(2, shard.stop - shard.start)
    logits[:, 3] = 1.0
    with shard.same_rows():
        assert shard.argmax(logits).tolist() == [3, 3]

    # a tiny Qwen3 with tied embeddings: its own forward through the split embedding and head
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                      tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    prompt = torch.randint(0, VOCAB, (1, 4 + 2 * rank), generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        want = model(prompt).logits
        assert shard_vocab(model, rank, world) is not None
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # held once
        torch.testing.assert_close(model(prompt).logits, want, rtol=1e-5, atol=1e-5)
    dist.destroy_process_group()


def test_a_split_vocabulary_gives_what_the_whole_one_gives(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(2, str(tmp_path / "store")), nprocs=2, start_method="spawn")


def test_a_vocabulary_smaller_than_the_ranks_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="cannot be split over 4 ranks"):
        VocabShard(3, 0, 4)
