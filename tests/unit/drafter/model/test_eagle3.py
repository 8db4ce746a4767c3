"""EAGLE-3's drafter: the training-time-test attention in its cache-list form equals the dense mask
over every step; step k at position t reads x[t + k + 1] and nothing later, and is labelled with
x[t + k + 2] under the shifted loss mask; the draft vocabulary's invariants and its round trip
through a state dict; the field's default layer ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftdeck.drafter.kinds.eagle3 import model as eagle3
from draftdeck.drafter.kinds.eagle3.model import (
    Eagle3Config,
    Eagle3Drafter,
    default_aux_layer_ids,
    ttt_attention,
    ttt_labels,
)
from draftdeck.drafter.model.config import DrafterConfigError
from draftdeck.shards.stats import TOKEN_COUNTS
from draftdeck.shards.tools import draft_vocab

torch.set_num_threads(1)
TARGET = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "intermediate_size": 48, "num_hidden_layers": 8, "vocab_size": 64}  # fmt: skip


def _dense(
    q: torch.Tensor, steps: list[tuple[torch.Tensor, torch.Tensor]], key_ok: torch.Tensor
) -> torch.Tensor:
    """Step k's attention through one dense mask over [step 0's keys ; step 1's ; ... ; step k's]
    (speculators' form): (k, t) sees (0, s) for s <= t where the key is real, and (j, t) for 1 <= j <= k."""
    bsz, heads, t, _ = q.shape
    group = heads // steps[0][0].shape[1]
    keys = torch.cat([k for k, _ in steps], dim=2).repeat_interleave(group, dim=1)
    values = torch.cat([v for _, v in steps], dim=2).repeat_interleave(group, dim=1)
    pos = torch.arange(t)
    visible = torch.zeros(bsz, t, len(steps) * t, dtype=torch.bool)
    visible[:, :, :t] = (pos[None, :] <= pos[:, None])[None] & key_ok[:, None, :]
    for j in range(1, len(steps)):
        visible[:, pos, j * t + pos] = True
    scores = (q @ keys.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ values


def test_cache_list_attention_equals_the_dense_mask_over_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eagle3, "QUERY_CHUNK", 3)  # several chunks of queries
    g = torch.Generator().manual_seed(0)
    bsz, heads, kv_heads, t, d = 2, 4, 2, 7, 8
    key_ok = torch.ones(bsz, t, dtype=torch.bool)
    key_ok[1, 5:] = False  # row 1 is padded on the right
    steps = [(torch.randn(bsz, kv_heads, t, d, generator=g), torch.randn(bsz, kv_heads, t, d, generator=g))
             for _ in range(4)]  # fmt: skip
    for k in range(4):
        q = torch.randn(bsz, heads, t, d, generator=g)
        got = ttt_attention(q, steps[: k + 1], key_ok, d**-0.5)
        torch.testing.assert_close(got, _dense(q, steps[: k + 1], key_ok), rtol=1e-5, atol=1e-6)


def _drafter() -> Eagle3Drafter:
    torch.manual_seed(0)
    return Eagle3Drafter(Eagle3Config.from_target(TARGET, draft_vocab_size=16)).eval()


def test_step_k_at_t_reads_the_token_t_plus_k_plus_1_and_nothing_later() -> None:
    drafter, t, steps = _drafter(), 10, 3
    g = torch.Generator().manual_seed(1)
    aux, embeds = torch.randn(1, t, 3 * 32, generator=g), torch.randn(1, t, 32, generator=g)
    base = drafter.ttt(aux, embeds, steps)
    at = 4
    for k in range(steps):
        read, later = embeds.clone(), embeds.clone()
        read[0, at + k + 1] += 1.0  # the token step k takes at `at`
        later[0, at + k + 2 :] += 1.0  # what it predicts, and everything after
        changed, unchanged = drafter.ttt(aux, read, steps)[k], drafter.ttt(aux, later, steps)[k]
        assert not torch.allclose(changed[0, at], base[k][0, at]), k
        torch.testing.assert_close(unchanged[0, : at + 1], base[k][0, : at + 1])
    # and the target's states at positions after t never reach t
    aux_later = aux.clone()
    aux_later[0, at + 1 :] += 1.0
    for k, h in enumerate(drafter.ttt(aux_later, embeds, steps)):
        torch.testing.assert_close(h[0, : at + 1], base[k][0, : at + 1])


def test_labels_are_two_plus_k_ahead_under_the_shifted_loss_mask() -> None:
    ids = torch.arange(100, 110)[None]
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 0, 0]])  # prompt 0..2, answer 3..7
    labels, counted = ttt_labels(ids, mask, steps=3)
    for k in range(3):
        for t in range(10):
            if t + k + 2 < 10:
                assert int(labels[0, k, t]) == 100 + t + k + 2
            assert bool(counted[0, k, t]) == (t + k + 2 < 10 and bool(mask[0, t + k + 2]))
    # step 0 at the position before the prompt's last token predicts the first answer token
    assert bool(counted[0, 0, 1]) and int(labels[0, 0, 1]) == 103


def test_the_draft_vocabulary_is_checked_and_kept_with_the_weights(tmp_path) -> None:
    counts = np.zeros(64, dtype=np.int64)
    counts[[3, 9, 10, 40]] = [5, 50, 7, 9]
    np.save(tmp_path / TOKEN_COUNTS, counts)
    vocab = draft_vocab(tmp_path, 16)  # 4 trained ids, and 12 unseen ones by id
    assert int(vocab.t2d.sum()) == 16
    ids = np.arange(16) + vocab.d2t
    assert (np.diff(ids) > 0).all() and (np.nonzero(vocab.t2d)[0] == ids).all()
    assert {3, 9, 10, 40} <= set(ids.tolist())
    drafter = _drafter()
    drafter.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
    again = _drafter()
    again.load_state_dict(drafter.state_dict())
    assert torch.equal(again.d2t, drafter.d2t) and torch.equal(again.t2d, drafter.t2d)
    assert again.target_ids(torch.arange(16)).tolist() == ids.tolist()
    shuffled = torch.from_numpy(vocab.d2t).flip(0)
    with pytest.raises(DrafterConfigError, match="d2t and t2d disagree"):
        drafter.set_vocab(shuffled, torch.from_numpy(vocab.t2d))


def test_default_layer_ids_are_the_fields() -> None:
    assert default_aux_layer_ids(32) == [2, 16, 29]  # Llama-3.1-8B: vLLM's and speculators' ids
    assert default_aux_layer_ids(36) == [2, 18, 33]  # Qwen3-8B
    assert default_aux_layer_ids(4) == [1, 2, 3]
    assert default_aux_layer_ids(3) == [1, 2, 3]  # a tiny target: its last three indices
    assert default_aux_layer_ids(2) == [0, 1, 2]
    with pytest.raises(DrafterConfigError, match="three distinct layers"):
        default_aux_layer_ids(1)
    with pytest.raises(DrafterConfigError, match="do not exist"):
        Eagle3Config.from_target(TARGET, draft_vocab_size=16, aux_layer_ids=[2, 4, 9])
