"""Position weights of the DFlash family's loss (`--position-weights dflash|exp|dpace`): each scheme's
weights worked by hand, D-PACE's loss and gradient against a slot-by-slot reference, the options'
refusals (EAGLE-3 keeps its per-step decay) and a tiny D-PACE run recorded in run.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torch.nn import functional as F

from draftdeck.drafter.kinds.dflash.objective import (
    block_loss,
    build_blocks,
    counted_slot_ce,
    label_weight_sum,
    slot_weights,
)
from draftdeck.drafter.kinds.dflash.position_weights import (
    PositionWeights,
    counted_weights,
    dpace_weights,
    exp_weights,
    fixed_weights,
)
from draftdeck.drafter.kinds.dflash2.model import DFlash2Config, DFlash2Drafter
from draftdeck.drafter.kinds.dspark.model import DSparkConfig, DSparkDrafter
from draftdeck.drafter.model.head import head_loss
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import run_train
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import (
    greedy_text,
    learnable_target,
    tiny_drafter_config,
    tiny_target,
    write_dataset,
)

torch.set_num_threads(1)
B = 4
# the drafter's probability of each slot's token, q = exp(-CE): smoothed by alpha 0.5, 0.9, 0.8, 0.7
Q = (0.8, 0.6, 0.4)


def test_dpace_weights_of_a_block_and_of_one_with_a_padded_slot_by_hand() -> None:
    ce = torch.tensor([[[5.0] + [-math.log(q) for q in Q]] * 2])  # slot 0, the anchor: any value
    counted = torch.tensor([[[False, True, True, True], [False, True, True, False]]])
    w = dpace_weights(ce, counted, alpha=0.5)
    # block 1: P = 0.9, 0.9*0.8 = 0.72, 0.72*0.7 = 0.504; w_k = P_k + ... + P_3
    # block 2 (slot 3 padded: neither its P nor a weight): P = 0.9, 0.72; w_1 = 1.62, w_2 = 0.72
    assert w[0, 0].tolist() == pytest.approx([0.0, 0.9 + 0.72 + 0.504, 0.72 + 0.504, 0.504])
    assert w[0, 1].tolist() == pytest.approx([0.0, 0.9 + 0.72, 0.72, 0.0])
    # alpha 1: every smoothed confidence is 1, each slot weighs the counted slots from it to the end
    assert dpace_weights(ce, counted, alpha=1.0)[0, 0].tolist() == pytest.approx([0.0, 3.0, 2.0, 1.0])


def test_a_slot_not_counted_in_the_middle_passes_the_product_through() -> None:
    """speculators' smoothing is 1 where the mask is 0: the product carries over a slot outside the
    loss mask (a padded slot in the middle) instead of being cut."""
    ce = torch.tensor([[0.0, -math.log(0.8), 9.0, -math.log(0.4)]])
    counted = torch.tensor([[False, True, False, True]])
    w = dpace_weights(ce, counted, alpha=0.5)
    assert w[0].tolist() == pytest.approx([0.0, 0.9 + 0.9 * 0.7, 0.0, 0.9 * 0.7])


def test_exp_weights_and_the_normalisers_of_each_scheme_by_hand() -> None:
    assert exp_weights(B, 0.5).tolist() == [0.0, 0.5, 0.25, 0.125]  # speculators' gamma ** pos_idx
    assert fixed_weights(PositionWeights("exp", exp_decay=1.0), B).tolist() == [0.0, 1.0, 1.0, 1.0]
    assert fixed_weights(PositionWeights(), B).tolist() == slot_weights(B, 7.0).tolist()  # dflash: today's
    # one row of 6 tokens, anchors at 0 and 3: block 2's slot 3 lies past the row (not counted)
    lm, anchors, valid = torch.ones(1, 6), torch.tensor([[0, 3]]), torch.tensor([[True, True]])
    assert label_weight_sum(lm, anchors, valid, B, PositionWeights("exp", exp_decay=0.5)) == pytest.approx(
        (0.5 + 0.25 + 0.125) + (0.5 + 0.25)
    )
    assert label_weight_sum(lm, anchors, valid, B, PositionWeights("dpace")) == 5.0  # D-PACE: the count
    assert label_weight_sum(lm, anchors, valid, B, 2.0) == label_weight_sum(
        lm, anchors, valid, B, PositionWeights(gamma=2.0)
    )


def _blocks() -> tuple[object, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (1, 10))
    lm = torch.ones_like(ids)
    lm[0, 9] = 0  # block 2's last slot is outside the loss mask
    bb = build_blocks(ids, lm, None, torch.tensor([[1, 6]]), torch.tensor([[True, True]]), B, 19)
    return bb, ids


def test_dpace_loss_and_gradient_equal_a_slot_by_slot_reference() -> None:
    """The loss is sum w * CE / N with w from the CE of this very forward, held constant (no_grad);
    the chunked head (an nn.Linear) and the unchunked one agree with the reference."""
    bb, ids = _blocks()
    head = nn.Linear(8, 20, bias=False)
    hidden = torch.randn(1, 2, B, 8, requires_grad=True)
    pw = PositionWeights("dpace", dpace_alpha=0.3)
    # the reference: each slot's CE, its smoothed confidence and the sums written out slot by slot
    ref_loss, n = torch.zeros(()), 0
    for a, p in enumerate([1, 6]):
        counted = [p + k < 9 for k in range(1, B)]  # token 9 is outside the mask
        ce = [F.cross_entropy(head(hidden[0, a, k])[None], ids[0, p + k][None]) for k in range(1, B)]
        smooth = [
            (1 - 0.3) * math.exp(-c.item()) + 0.3 if ok else 1.0 for c, ok in zip(ce, counted, strict=True)
        ]
        prefix = [math.prod(smooth[: j + 1]) if counted[j] else 0.0 for j in range(B - 1)]
        for k in range(B - 1):
            if counted[k]:
                ref_loss = ref_loss + sum(prefix[k:]) * ce[k]
                n += 1
    ref_loss = ref_loss / n
    (ref_grad,) = torch.autograd.grad(ref_loss, hidden)
    assert n == 5
    for chunked in (True, False):
        res = block_loss(head, hidden, bb, pw, chunked_head=chunked)  # type: ignore[arg-type]
        assert res.loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
        (grad,) = torch.autograd.grad(res.loss, hidden)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6)


def test_dflash_weights_unchanged_by_default() -> None:
    """A bare gamma and the default `PositionWeights` give the same loss, DFlash's sum w CE / sum w."""
    bb, _ = _blocks()
    hidden = torch.randn(1, 2, B, 20)
    old = block_loss(nn.Identity(), hidden, bb, 2.0)  # type: ignore[arg-type]
    new = block_loss(nn.Identity(), hidden, bb, PositionWeights(gamma=2.0))  # type: ignore[arg-type]
    assert old.loss.item() == new.loss.item()


@pytest.mark.parametrize("kind", ["dspark", "dflash2"])
def test_dpace_reads_each_kinds_own_slot_ce_and_its_step_trains_the_drafter(kind: str) -> None:
    """DSpark's CE is its own logits' (the head's plus the Markov bias), as its loss's `ce`; DFlash2's the
    head's (its selector reranks the top-k after). The step's gradient reaches the drafter's own heads."""
    from dataclasses import asdict

    target = tiny_target(0, vocab_size=64, hidden=32, layers=2)
    shape = asdict(tiny_drafter_config(target, block_size=4))
    torch.manual_seed(2)
    drafter = (
        DSparkDrafter(DSparkConfig(**shape, markov_rank=8, confidence_head=False))
        if kind == "dspark"
        else DFlash2Drafter(DFlash2Config(**shape, conv_group_size=8))
    )
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    ids = torch.randint(0, 60, (1, 12))
    anchors, valid = torch.tensor([[1, 6]]), torch.tensor([[True, True]])
    bb = build_blocks(ids, torch.ones_like(ids), None, anchors, valid, 4, 63, shift=drafter.shift)
    hidden = torch.randn(1, 2, bb.slots, 32, requires_grad=True)
    sel, labels = bb.label_valid, bb.labels[bb.label_valid]
    previous = bb.previous()
    features = drafter.block_features(hidden, previous)
    rows = None if features is None else features[sel]
    own = drafter.slot_loss(
        target.lm_head, hidden[sel], previous[sel], rows, labels, torch.ones(labels.shape)
    )
    expected = dpace_weights(torch.zeros(sel.shape).masked_scatter(sel, own.ce), sel, 0.5)[sel]
    w = counted_weights(
        PositionWeights("dpace"), sel, lambda: counted_slot_ce(target.lm_head, hidden, bb, drafter)
    )
    torch.testing.assert_close(w, expected)
    head_only = head_loss(target.lm_head, hidden[sel].detach(), labels, torch.ones(labels.shape)).ce
    assert torch.equal(own.ce, head_only) == (kind == "dflash2")  # DSpark's bias moves its CE
    res = block_loss(target.lm_head, hidden, bb, PositionWeights("dpace"), drafter=drafter)
    res.loss.backward()
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0
    own_heads = [p for n, p in drafter.named_parameters() if "markov" in n or "selector" in n]
    assert own_heads and all(p.grad is not None and p.grad.abs().sum() > 0 for p in own_heads)


def test_eagle3_refuses_position_weights_and_each_parameter_needs_its_scheme(tmp_path: Path) -> None:
    base = dict(inputs=[str(tmp_path)], target=str(tmp_path))
    with pytest.raises(
        ValidationError, match=r"position_weights: a DFlash-family option \(give drafter dflash"
    ):
        TrainParams(**base, drafter="eagle3", position_weights="dpace")
    with pytest.raises(ValidationError, match="dpace_alpha: read with position_weights dpace only"):
        TrainParams(**base, dpace_alpha=0.3)
    with pytest.raises(ValidationError, match="exp_decay: read with position_weights exp only"):
        TrainParams(**base, position_weights="dpace", exp_decay=0.5)
    for kind in ("dflash", "dflash2", "dspark"):
        p = TrainParams(**base, drafter=kind, position_weights="dpace", dpace_alpha=0.3)
        assert (p.position_weights, p.dpace_alpha) == ("dpace", 0.3)
    assert TrainParams(**base, drafter="eagle3").position_weights == "dflash"


def test_a_tiny_dpace_run_trains_and_names_its_weights_in_run_json(tmp_path: Path) -> None:
    target = learnable_target(tmp_path / "target")
    ds = write_dataset(tmp_path / "ds", greedy_text(target, 16), target)
    params = TrainParams(
        inputs=[str(ds)], target=str(target), out=str(tmp_path / "run"), block_size=4, anchors_per_seq=8,
        batch_size=4, lr=1e-2, max_steps=4, checkpoint_every=4, eval_every=4, log_every=2,
        heldout_fraction=0.25, truth_rows=0, device="cpu", position_weights="dpace", dpace_alpha=0.4,
    )  # fmt: skip
    ctx = LocalContext(tmp_path / "ctx")
    run_train(params, ctx)
    loss = [v for _, v in ctx.series("train/loss")]
    assert len(loss) == 2 and all(math.isfinite(v) and v > 0 for v in loss), loss
    record = json.loads((tmp_path / "run/run.json").read_text())
    assert "w_k = D-PACE(alpha=0.4)" in record["loss"] and "/ N_counted" in record["loss"], record["loss"]
    assert "exp(-(k-1)/gamma)" not in record["loss"]
    assert record["steps_done"] == 4
