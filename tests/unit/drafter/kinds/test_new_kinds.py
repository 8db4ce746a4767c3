"""DSpark's and DFlash2's parts as their papers define them, on a tiny target: the Markov head makes a
draft depend on the one before it, the confidence head can stop a block early, DFlash2's convolutions
see only earlier slots of their own block and start as the identity, the selector picks only among the
head's top-k; the options reach the right kind and no other."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from pydantic import ValidationError

from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash2.model import (
    DFlash2Config,
    DFlash2Drafter,
    LocalConv,
    grouped_causal_conv,
)
from draftdeck.drafter.kinds.dspark.model import DSparkConfig, DSparkDrafter
from draftdeck.drafter.model.config import DrafterConfigError
from draftdeck.drafter.model.head import head_topk
from draftdeck.drafter.train.params import TrainParams
from tests.support.drafter import tiny_drafter_config, tiny_target

M = TypeVar("M", bound=torch.nn.Module)

torch.set_num_threads(1)


def _randomized(drafter: M, seed: int = 5) -> M:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return drafter.eval()


@pytest.fixture(scope="module")
def target():
    return tiny_target(0, vocab_size=64, hidden=32, layers=2)


@pytest.mark.parametrize("markov", ["vanilla", "gated", "rnn"])
def test_dspark_drafts_each_token_given_the_draft_before_it(target, markov: str) -> None:
    shape = asdict(tiny_drafter_config(target, block_size=4))
    drafter = _randomized(DSparkDrafter(DSparkConfig(**shape, markov_rank=8, markov_head_type=markov)))
    assert isinstance(drafter, DSparkDrafter) and drafter.slots == 5  # from the anchor: 4 drafts a block
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    head = target.lm_head
    drafts = drafter.choose_drafts(head, hidden, anchor=3, want=4)
    assert len(drafts) == 4
    # the first draft comes from slot 1 given the anchor; changing the anchor changes it (the bias)
    firsts = {drafter.choose_drafts(head, hidden, anchor=a, want=1)[0] for a in range(0, 60, 3)}
    assert len(firsts) > 1
    # with no Markov head the same hidden states give one first draft whatever the anchor
    plain = _randomized(DSparkDrafter(DSparkConfig(**shape, markov_rank=0, confidence_head=False)))
    assert len({plain.choose_drafts(head, hidden, anchor=a, want=1)[0] for a in range(0, 60, 3)}) == 1


def test_dspark_confidence_stops_a_block_where_the_product_falls_below_the_threshold(target) -> None:
    shape = asdict(tiny_drafter_config(target, block_size=4))
    drafter = _randomized(DSparkDrafter(DSparkConfig(**shape, markov_rank=8)))
    assert isinstance(drafter, DSparkDrafter)
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(2))
    full = drafter.choose_drafts(target.lm_head, hidden, anchor=3, want=4)
    with torch.no_grad():
        assert drafter.confidence_head is not None
        drafter.confidence_head.proj.bias.fill_(-50.0)  # every slot predicted rejected
    assert drafter.choose_drafts(target.lm_head, hidden, anchor=3, want=4, threshold=0.5) == []
    assert drafter.choose_drafts(target.lm_head, hidden, anchor=3, want=4) == full  # no threshold: all
    with torch.no_grad():
        drafter.confidence_head.proj.bias.fill_(50.0)  # every slot predicted accepted
    assert drafter.choose_drafts(target.lm_head, hidden, anchor=3, want=4, threshold=0.5) == full


def test_dspark_config_refuses_a_confidence_head_reading_a_missing_markov_embedding(target) -> None:
    shape = asdict(tiny_drafter_config(target))
    with pytest.raises(DrafterConfigError, match="markov_rank > 0"):
        DSparkConfig(**shape, markov_rank=0, confidence_with_markov=True)
    with pytest.raises(DrafterConfigError, match="markov_head_type"):
        DSparkConfig(**shape, markov_head_type="lstm")


def test_dflash2_convolution_reads_only_earlier_slots_of_its_own_block() -> None:
    g = torch.Generator().manual_seed(0)
    block, hidden, group, taps = 4, 8, 4, 3
    x = torch.randn(2 * block, hidden, generator=g)
    delta = torch.randn(2 * block, taps, hidden // group, generator=g)
    base = torch.randn(taps, hidden, generator=g)
    out = grouped_causal_conv(x, delta, base, block, group)
    changed = x.clone()
    changed[5] += 1.0  # slot 1 of the second block
    moved = (grouped_causal_conv(changed, delta, base, block, group) - out).abs().sum(-1)
    assert moved[:5].eq(0).all()  # nothing before it, and nothing in the first block
    assert moved[5:].gt(0).all()  # itself and the later slots of its block (taps 0..2 reach slot 3)
    # slot 0 of the second block does not see the first block's last slot
    changed = x.clone()
    changed[3] += 1.0
    assert torch.equal(grouped_causal_conv(changed, delta, base, block, group)[4:], out[4:])


def test_a_fresh_dflash2_drafter_is_a_dflash_drafter_until_trained(target) -> None:
    shape = tiny_drafter_config(target, block_size=4)
    torch.manual_seed(3)
    dflash = DFlashDrafter(shape).eval()
    dflash2 = DFlash2Drafter(DFlash2Config(**asdict(shape), conv_group_size=8)).eval()
    dflash2.load_state_dict(dflash.state_dict(), strict=False)  # same layers; convolutions stay identity
    block = target.embed(torch.randint(0, 60, (1, 4)))
    context = torch.randn(1, 6, len(shape.target_layer_ids) * 32)
    positions = torch.arange(10)[None]
    with torch.no_grad():
        a = dflash(positions, noise_embedding=block, target_hidden=context)
        b = dflash2(positions, noise_embedding=block, target_hidden=context)
    assert torch.allclose(a, b, atol=1e-6)
    with torch.no_grad():  # a trained convolution changes it
        conv = dflash2.decoder_layers[0].mlp_conv
        assert isinstance(conv, LocalConv)
        conv.base_kernel[1, 1].fill_(0.5)
        assert not torch.allclose(a, dflash2(positions, noise_embedding=block, target_hidden=context))


def test_dflash2_drafts_only_among_the_heads_top_k(target) -> None:
    shape = asdict(tiny_drafter_config(target, block_size=4))
    drafter = _randomized(DFlash2Drafter(DFlash2Config(**shape, selector_rank=8, selector_top_k=3)))
    assert isinstance(drafter, DFlash2Drafter) and drafter.slots == 4  # after the anchor: 3 drafts
    hidden = torch.randn(4, 32, generator=torch.Generator().manual_seed(4))
    drafts = drafter.choose_drafts(target.lm_head, hidden, anchor=7, want=3)
    top = head_topk(target.lm_head, hidden, 3)[1]
    assert len(drafts) == 3 and all(d in top[k + 1].tolist() for k, d in enumerate(drafts))
    # the selector reranks by the previous token: some anchor changes the first draft
    assert len({drafter.choose_drafts(target.lm_head, hidden, anchor=a, want=1)[0] for a in range(60)}) > 1


def test_a_kinds_options_reach_its_runs_and_are_refused_by_name_for_another_kind(tmp_path: Path) -> None:
    base = {"inputs": [str(tmp_path)], "target": str(tmp_path), "out": str(tmp_path / "run")}
    assert TrainParams(**base, drafter="dspark", markov_rank=8).markov_rank == 8
    assert TrainParams(**base, drafter="dflash2", selector_top_k=4).selector_top_k == 4
    with pytest.raises(ValidationError, match=r"markov_rank.*a DSpark option"):
        TrainParams(**base, drafter="dflash", markov_rank=8)
    with pytest.raises(ValidationError, match="DFlash2 option"):
        TrainParams(**base, drafter="eagle3", selector_rank=8)
    with pytest.raises(ValidationError, match=r"mtp_steps: an MTP option \(give drafter mtp\)"):
        TrainParams(**base, drafter="dflash", mtp_steps=2)
    # the DFlash family's options are DSpark's and DFlash2's too
    assert TrainParams(**base, drafter="dspark", block_size=7).block_size == 7
    assert get_kind("dspark").slots({"block_size": 7}) == 8
    assert get_kind("dspark").slots({"block_size": 7, "sample_from_anchor": False}) == 7
    assert get_kind("dflash2").slots({"block_size": 7}) == 7


def test_dspark_warm_starts_from_a_dflash_checkpoint_of_the_same_shape_and_refuses_others(
    target,
    tmp_path: Path,
) -> None:
    from draftdeck.drafter.export.folder import CheckpointError
    from draftdeck.drafter.kinds.dflash.export import save_zlab
    from draftdeck.drafter.kinds.dspark.export import save_dspark, warm_start

    shape = tiny_drafter_config(target, block_size=4)
    dflash = _randomized(DFlashDrafter(shape), seed=9)
    save_zlab(dflash, tmp_path / "dflash")
    dspark = DSparkDrafter(DSparkConfig(**asdict(shape), markov_rank=8))
    heads = {k: v.clone() for k, v in dspark.state_dict().items() if k.startswith(("markov", "confidence"))}
    said = warm_start(dspark, tmp_path / "dflash")
    assert "warm start" in said and str(tmp_path / "dflash") in said
    own = dspark.state_dict()
    assert all(torch.equal(own[k], v) for k, v in dflash.state_dict().items())
    assert all(torch.equal(own[k], v) for k, v in heads.items())  # the heads start fresh
    save_dspark(dspark, tmp_path / "dspark")
    with pytest.raises(CheckpointError, match="another kind"):
        warm_start(dspark, tmp_path / "dspark")
    wider = DSparkDrafter(DSparkConfig(**asdict(tiny_drafter_config(target, layers=2)), markov_rank=8))
    with pytest.raises(CheckpointError, match="another shape"):
        warm_start(wider, tmp_path / "dflash")
