"""EAGLE-3's objective: the loss, its parts and the counts equal a position-by-position reference
(CE over the draft vocabulary, KL from the target's restricted distribution, decay^k, the shifted
mask, labels outside the draft vocabulary); the target's view over the draft ids; and the drafter
overfits a few rows of a counting language (every step's accuracy towards 1)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from draftdeck.drafter.kinds.eagle3.model import Eagle3Config, Eagle3Drafter, ttt_labels
from draftdeck.drafter.kinds.eagle3.objective import draft_index, target_draft_view, ttt_loss
from tests.support.drafter import cycle_batch, tiny_target

torch.set_num_threads(1)
V, H, N, STEPS = 40, 32, 12, 3
TARGET = {"hidden_size": H, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "intermediate_size": 48, "num_hidden_layers": 6, "vocab_size": V}  # fmt: skip


def _world() -> tuple[Eagle3Drafter, nn.Linear, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    drafter = Eagle3Drafter(Eagle3Config.from_target(TARGET, draft_vocab_size=N))
    ids = torch.randperm(V, generator=g)[:N].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    drafter.set_vocab(ids - torch.arange(N), t2d)
    head = nn.Linear(H, V, bias=False)
    t = 9
    input_ids = torch.randint(0, V, (2, t), generator=g)
    input_ids[0, 5] = ids[3]  # some labels in the draft vocabulary for sure
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 0, 0, 0]])
    aux, embeds = torch.randn(2, t, 3 * H, generator=g), torch.randn(2, t, H, generator=g)
    last = torch.randn(2, t, H, generator=g)
    return drafter, head, (aux, embeds, input_ids, loss_mask, last)


def test_the_target_view_is_its_distribution_over_the_draft_ids() -> None:
    drafter, head, (*_, last) = _world()
    ids = drafter.target_ids(torch.arange(N))
    view = target_draft_view(head, last, ids)
    whole = torch.softmax(head(last).float(), dim=-1)
    torch.testing.assert_close(view.p, whole[..., ids])
    torch.testing.assert_close(view.logp.exp(), whole[..., ids] / whole[..., ids].sum(-1, keepdim=True))
    assert torch.equal(view.greedy, whole.argmax(-1))
    assert draft_index(drafter.t2d)[ids].tolist() == list(range(N))


def test_loss_and_counts_equal_a_position_by_position_reference() -> None:
    drafter, head, (aux, embeds, input_ids, loss_mask, last) = _world()
    ids = drafter.target_ids(torch.arange(N))
    view = target_draft_view(head, last, ids)
    mix, decay = (0.5, 2.0), 0.8
    res = ttt_loss(
        drafter, aux, embeds, input_ids, loss_mask, None, STEPS, teacher=view, mix=mix, decay=decay
    )
    with torch.no_grad():
        hidden = drafter.ttt(aux, embeds, STEPS)
        whole = torch.softmax(head(last).float(), dim=-1)
    total, wsum, correct, counted_n, accept = 0.0, 0.0, [0] * STEPS, [0] * STEPS, [0.0] * STEPS
    chain = []
    for r in range(2):
        for t in range(9):
            run, alive = 0, True
            for k in range(STEPS):
                pos = t + k + 2
                if pos >= 9 or not loss_mask[r, pos]:
                    alive = False
                    continue
                q = torch.softmax(drafter.logits(hidden[k][r, t]).detach().float(), dim=-1)
                p = whole[r, t + k + 1]
                restricted = p[ids] / p[ids].sum()
                label = int(input_ids[r, pos])
                ce = -math.log(float(q[ids.tolist().index(label)])) if label in ids.tolist() else 0.0
                kl = float((restricted * (restricted.log() - q.log())).sum())
                total += decay**k * (mix[0] * ce + mix[1] * kl)
                wsum += decay**k
                hit = int(ids[int(q.argmax())]) == label
                correct[k] += hit
                counted_n[k] += 1
                accept[k] += float(torch.minimum(p[ids], q).sum())
                alive = alive and hit
                run += alive
            if pos_ok := (t + 2 < 9 and bool(loss_mask[r, t + 2])):
                chain.append(run)
            assert pos_ok == (int(res.runs[r, t]) >= 0)
    assert float(res.loss.detach()) == pytest.approx(total / wsum, rel=1e-5)
    c = res.counts
    assert c.correct[1:] == correct and c.total[1:] == counted_n and c.weight_sum == pytest.approx(wsum)
    assert c.accept_sum[1:] == pytest.approx(accept, rel=1e-5)
    assert c.anchor_blocks == len(chain) and c.anchor_accepted == sum(chain)
    assert int(ttt_labels(input_ids, loss_mask, STEPS)[1].sum()) == sum(counted_n)
    res.loss.backward()  # the loss has a gradient for every trained part
    assert drafter.fc.weight.grad is not None and drafter.lm_head.weight.grad is not None


def test_the_drafter_overfits_a_few_rows() -> None:
    target = tiny_target(0, vocab_size=160, layers=4, hidden=32)
    ids = cycle_batch(8, 24, torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[:, :3] = 0
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True)
    torch.manual_seed(0)
    drafter = Eagle3Drafter(Eagle3Config.from_target(target.config, draft_vocab_size=160))
    drafter.set_vocab(torch.zeros(160, dtype=torch.long), torch.ones(160, dtype=torch.bool))
    aux = torch.cat([out.hidden_states[i] for i in drafter.config.aux_layer_ids], dim=-1)
    embeds = target.embed(ids)
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for _ in range(60):
        res = ttt_loss(drafter, aux, embeds, ids, mask, None, STEPS)
        res.loss.backward()
        opt.step()
        opt.zero_grad()
    c = res.counts
    assert [c.correct[k] / c.total[k] for k in range(1, STEPS + 1)] == pytest.approx([1.0] * STEPS, abs=0.05)
    # the chains run as far as the row lets them: every counted step accepted
    counted = ttt_labels(ids, mask, STEPS)[1]
    longest = counted.long().cumprod(dim=1).sum(dim=1)[counted[:, 0]]
    assert c.anchor_accepted >= 0.95 * int(longest.sum())
