"""`--optimizer muon`: PyTorch's Muon over the hidden layers' 2-D matrices and AdamW over the rest,
stepped and scheduled together; its state counted as one buffer per parameter (AdamW's two) by the
memory check and the planner."""

from __future__ import annotations

import pytest
import torch

from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.train.optimizers import Schedules, build, split_for_muon, state_bytes
from draftdeck.drafter.train.params import PlanParams, TrainParams
from draftdeck.drafter.train.plan import Shape, plan, target_config
from tests.conftest import REPO_ROOT
from tests.support.drafter import tiny_drafter_config, tiny_target

LAYER_MATRICES = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
}  # fmt: skip


def _drafter() -> DFlashDrafter:
    torch.manual_seed(0)
    return DFlashDrafter(tiny_drafter_config(tiny_target(), layers=2))


def test_muon_takes_the_hidden_layers_matrices_and_adamw_everything_else() -> None:
    drafter = _drafter()
    muon, adamw = split_for_muon(drafter)
    name = {id(p): n for n, p in drafter.named_parameters()}
    assert sorted(name[id(p)] for p in muon) == sorted(
        f"layers.{i}.{m}" for i in (0, 1) for m in LAYER_MATRICES
    )
    rest = {name[id(p)] for p in adamw}
    assert "fc.weight" in rest and "norm.weight" in rest and "layers.0.input_layernorm.weight" in rest
    assert len(muon) + len(adamw) == len(list(drafter.parameters()))


def test_both_optimizers_step_together_each_with_its_own_state_and_the_same_schedule() -> None:
    drafter = _drafter()
    opt = build(drafter, "muon", lr=1e-2, weight_decay=0.0)
    assert [type(p).__name__ for p in opt.parts] == ["Muon", "AdamW"]
    sched = Schedules(opt, lambda step: 0.5 ** (step + 1))
    assert {g["lr"] for g in opt.param_groups} == {5e-3}
    before = {n: p.detach().clone() for n, p in drafter.named_parameters()}
    for p in drafter.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    sched.step()
    opt.zero_grad()
    assert all(not torch.equal(before[n], p) for n, p in drafter.named_parameters())  # every one moved
    muon, adamw = split_for_muon(drafter)
    assert all(set(opt.state[p]) == {"momentum_buffer"} for p in muon)
    assert all(set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq"} for p in adamw)
    assert {g["lr"] for g in opt.param_groups} == {2.5e-3}
    state = sched.state_dict()
    assert isinstance(state, list) and len(state) == 2
    again = Schedules(build(drafter, "muon", lr=1e-2, weight_decay=0.0), lambda step: 1.0)
    again.load_state_dict(state)
    assert [s.last_epoch for s in again] == [1, 1]
    with pytest.raises(ValueError, match="2 schedules saved for 1 optimizers"):
        Schedules(build(drafter, "adamw", lr=1e-2, weight_decay=0.0), lambda step: 1.0).load_state_dict(state)


def test_muon_state_is_one_buffer_where_adamw_keeps_two() -> None:
    drafter = _drafter()
    muon, _ = split_for_muon(drafter)
    n = sum(p.numel() for p in drafter.parameters())
    assert state_bytes(drafter, "adamw") == 8 * n
    assert state_bytes(drafter, "muon") == 8 * n - 4 * sum(p.numel() for p in muon)


def test_the_planner_counts_muon_state_by_hand_on_qwen3_8b() -> None:
    config = target_config(REPO_ROOT / "tests/fixtures/configs/qwen3-8b.json")
    adamw = plan(config, Shape(layers=5, world=8), None)
    muon = plan(config, Shape(layers=5, world=8, optimizer="muon"), None)
    # per layer: q and o (4096 x 32 x 128), k and v (4096 x 8 x 128), the MLP's three (4096 x 12288)
    matrices = 5 * (2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 3 * 4096 * 12_288)
    for strategy, shards in (("ddp", 1), ("fsdp", 8)):
        a = adamw.strategies[strategy].terms["optimizer state"]
        m = muon.strategies[strategy].terms["optimizer state"]
        assert a == 8 * adamw.trainable_params // shards
        assert m == (8 * adamw.trainable_params - 4 * matrices) // shards
    assert PlanParams(target="x", optimizer="muon").optimizer == "muon"
    with pytest.raises(ValueError, match="optimizer"):
        TrainParams(inputs=["d"], target="t", optimizer="sgd")
