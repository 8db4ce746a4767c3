"""P-EAGLE's parts on a tiny target: one forward drafts every depth of every chain (COD's subset computes
exactly the dense forward's elements), COD sampling keeps the counts per depth its ratios give, real
decoding is lossless with one drafter forward a step and is the walk step for step, and the export in
speculators' format reads back weight for weight with the flags vLLM needs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from draftdeck.drafter.eval.spec_decode import TargetRunner, generate_plain, generate_speculative
from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.kinds.base import Verifier
from draftdeck.drafter.kinds.eagle3.model import ttt_labels
from draftdeck.drafter.kinds.eagle3.walked import runs_at_anchors
from draftdeck.drafter.kinds.peagle.cod import cod_sample, kept_anchors
from draftdeck.drafter.kinds.peagle.export import load_peagle
from draftdeck.drafter.kinds.peagle.model import PEagleConfig, PEagleDrafter, dense_anchors
from draftdeck.drafter.kinds.peagle.objective import peagle_loss
from draftdeck.drafter.kinds.peagle.source import PEagleSource
from draftdeck.drafter.kinds.peagle.walked import mask_embedding
from draftdeck.drafter.model.config import DrafterConfigError
from draftdeck.drafter.train.walked import walk
from tests.support.drafter import cycle_batch, tiny_target

torch.set_num_threads(1)
TARGET = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "intermediate_size": 48, "num_hidden_layers": 8, "vocab_size": 64}  # fmt: skip


def _drafter(depths: int = 4, vocab: int = 64, target: object = TARGET) -> PEagleDrafter:
    torch.manual_seed(0)
    cfg = PEagleConfig.of_target(
        target, draft_vocab_size=vocab, aux_layer_ids=None, mask_token_id=vocab - 1, num_depths=depths
    )
    return PEagleDrafter(cfg)


def test_one_forward_drafts_every_depth_and_cod_computes_the_same_elements() -> None:
    drafter, bsz, t, depths = _drafter(), 2, 12, 4
    g = torch.Generator().manual_seed(1)
    aux, emb, mask = (
        torch.randn(bsz, t, 96, generator=g),
        torch.randn(bsz, t, 32, generator=g),
        torch.randn(32),
    )
    dense = drafter.parallel(aux, emb, mask, dense_anchors(bsz, t, depths, aux.device))
    assert [tuple(h.shape) for h in dense] == [(bsz, t, 32)] * depths
    ids = torch.randint(0, 63, (bsz, t), generator=g)
    counted = ttt_labels(ids, torch.ones_like(ids), depths)[1]
    kept = torch.stack(
        [cod_sample(row, 0.7, 0.2, torch.Generator().manual_seed(b)) for b, row in enumerate(counted)]
    )
    anchors = kept_anchors(kept)
    sampled = drafter.parallel(aux, emb, mask, anchors)
    for d, (h, pos) in enumerate(zip(sampled, anchors, strict=True)):
        real = pos < t
        assert int(real.sum()) == int(kept[:, d].sum())
        rows = torch.arange(bsz)[:, None].expand_as(pos)
        torch.testing.assert_close(h[real], dense[d][rows[real], pos[real]], atol=1e-5, rtol=1e-5)
    # depth d >= 1 sees the mask inputs: changing mask_hidden moves them, never depth 0
    with torch.no_grad():
        drafter.mask_hidden.add_(1.0)
    moved = drafter.parallel(aux, emb, mask, dense_anchors(bsz, t, depths, aux.device))
    torch.testing.assert_close(moved[0], dense[0])
    assert not torch.allclose(moved[1], dense[1])


def test_cod_keeps_the_counts_its_ratios_give_and_chains_whole_below() -> None:
    t, depths = 40, 6
    loss_mask = torch.zeros(1, t, dtype=torch.long)
    loss_mask[:, 10:] = 1  # a 10-token prompt: 30 trained tokens
    counted = ttt_labels(torch.zeros(1, t, dtype=torch.long), loss_mask, depths)[1][0]
    n = int(counted[0].sum())
    assert n == 30  # anchors 8..37: their label x[t + 2] is trained
    kept = cod_sample(counted, 0.7, 0.2, torch.Generator().manual_seed(0))
    assert int(kept[0].sum()) == t  # depth 0: every position (every chain's context)
    for d in range(1, depths):
        pool = int((kept[d - 1] & counted[d]).sum())  # the chains kept above whose depth-d label is trained
        assert int(kept[d].sum()) == min(pool, int((n - d) * max(0.7**d, 0.2))), d
        assert bool((kept[d] <= kept[d - 1]).all()) and bool((kept[d] <= counted[d]).all())
    again = cod_sample(counted, 0.7, 0.2, torch.Generator().manual_seed(0))
    assert torch.equal(kept, again)  # drawn from the row's generator: a resumed run draws the same
    # a ratio of 1 keeps every trainable chain, as dense training would
    full = cod_sample(counted, 1.0, 0.2, torch.Generator().manual_seed(0))
    assert [int(x) for x in full.sum(1)] == [t] + [n - d for d in range(1, depths)]


def test_decoding_is_lossless_one_forward_a_step_and_is_the_walk() -> None:
    depths, new = 3, 20
    target = tiny_target(0, vocab_size=160, layers=4, hidden=32)
    runner = TargetRunner(target, eos_ids=[])
    prompts = cycle_batch(6, 4, torch.Generator().manual_seed(0)).tolist()
    answers = [generate_plain(runner, p, new).output_ids for p in prompts]
    ids = torch.tensor([p + a for p, a in zip(prompts, answers, strict=True)])
    mask = torch.zeros_like(ids)
    mask[:, 4:] = 1
    drafter = _drafter(depths, 160, target.config)
    drafter.set_vocab(torch.zeros(160, dtype=torch.long), torch.ones(160, dtype=torch.bool))
    with torch.no_grad():
        states = target.model(input_ids=ids, output_hidden_states=True).hidden_states
    aux = torch.cat([states[i] for i in drafter.config.aux_layer_ids], dim=-1)
    embeds, mask_embed = target.embed(ids), mask_embedding(drafter, target, torch.float32)
    anchors = dense_anchors(ids.shape[0], ids.shape[1], depths, ids.device)
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for _ in range(25):  # part-trained: some chains accepted whole, some cut short
        peagle_loss(drafter, aux, embeds, mask_embed, ids, mask, None, anchors, depths=depths).loss.backward()
        opt.step()
        opt.zero_grad()
    sources = [PEagleSource(drafter, target) for _ in prompts]
    real = [
        generate_speculative(runner, s, p, new, depths + 1) for s, p in zip(sources, prompts, strict=True)
    ]
    assert [g.output_ids for g in real] == answers  # lossless
    assert [s.forwards for s in sources] == [g.steps for g in real]  # one drafter forward a verify step
    with torch.no_grad():
        runs = peagle_loss(drafter, aux, embeds, mask_embed, ids, mask, None, anchors, depths=depths).runs
    assert runs is not None
    walked = walk(runs_at_anchors(runs), mask.numpy().astype(np.int8), depths + 1)
    assert walked.walked_steps == sum(g.steps for g in real)
    assert walked.walked_accepted == sum(g.accepted for g in real)
    assert 0 < walked.walked_accepted < depths * walked.walked_steps  # neither none nor every draft


def test_the_export_reads_back_with_the_mask_and_the_flags_vllm_needs(tmp_path: Path) -> None:
    drafter = _drafter(5)
    with torch.no_grad():
        drafter.midlayer.hidden_norm.weight.uniform_(0.5, 1.5)  # a norm loaded wrongly shows
    kind = get_kind("peagle")
    out = kind.export(drafter, tmp_path / "x", "speculators", Verifier("/models/t", ("Qwen3ForCausalLM",)))
    config = json.loads((out / "config.json").read_text())
    assert kind.owns(config) and get_kind("eagle3").owns(config) is False
    assert (
        config["architectures"] == ["PEagleSpeculator"]
        and config["speculators_config"]["algorithm"] == "peagle"
    )
    assert config["mask_token_id"] == config["pard_token"] == 63 and kind.verify_block(out, config) == 6
    back = load_peagle(out)
    for (name, a), (_, b) in zip(drafter.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    vllm, sglang = kind.served(out, "speculators", "/models/t", 6)
    assert vllm["problems"] == [] and '"parallel_drafting": true' in vllm["flags"]
    assert '"num_speculative_tokens": 5' in vllm["flags"] and sglang["problems"]
    config["speculators_model_type"] = "eagle3"
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="not a readable P-EAGLE export"):
        load_peagle(out)
    with pytest.raises(DrafterConfigError, match="mask_token_id 64 is outside"):
        PEagleConfig.of_target(TARGET, draft_vocab_size=8, aux_layer_ids=None, mask_token_id=64, num_depths=2)
