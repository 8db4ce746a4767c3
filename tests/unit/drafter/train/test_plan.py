"""The planner counts real configs' parameters exactly (checked here by hand arithmetic, from the
published shapes) and says what fits where; the CLI prints it as a table and as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftdeck.drafter.train.plan import Shape, plan, target_config
from draftdeck.errors import UsageError
from tests.conftest import REPO_ROOT

CONFIGS = REPO_ROOT / "tests/fixtures/configs"
GiB = 2**30


def _dense(
    vocab: int, hidden: int, layers: int, heads: int, kv: int, head_dim: int, mlp: int, qk_norm: bool
) -> int:
    """A Llama/Qwen3 decoder: embedding, layers (q, k, v, o, the MLP's three, two norms, Qwen3's
    q/k norms), the final norm, an untied head."""
    attention = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2 + (2 * head_dim if qk_norm else 0)
    layer = attention + 3 * hidden * mlp + 2 * hidden
    return 2 * vocab * hidden + layers * layer + hidden


def _drafter(hidden: int, heads: int, kv: int, head_dim: int, mlp: int, layers: int, n_ids: int) -> int:
    """DFlash: Qwen3 layers at the target's shapes, fc from n_ids target layers, two norms."""
    return _dense(0, hidden, layers, heads, kv, head_dim, mlp, True) + n_ids * hidden * hidden + hidden


def test_qwen3_8b_and_llama_3_1_8b_counted_as_published() -> None:
    qwen = plan(target_config(CONFIGS / "qwen3-8b.json"), Shape(layers=5, world=8), 80 * GiB)
    assert qwen.target_params == _dense(151_936, 4096, 36, 32, 8, 128, 12_288, True) == 8_190_735_360
    assert qwen.trainable_params == _drafter(4096, 32, 8, 128, 12_288, 5, 5)
    llama = plan(target_config(CONFIGS / "llama-3.1-8b.json"), Shape(layers=1, world=8), 80 * GiB)
    assert llama.target_params == _dense(128_256, 4096, 32, 32, 8, 128, 14_336, False) == 8_030_261_248
    # Qwen3-8B on 8 x 80 GiB: all three fit, and auto replicates
    assert [s.fits for s in qwen.strategies.values()] == [True, True, True]
    assert qwen.auto[0] == "ddp"


def test_qwen3_6_27b_class_hybrid_fits_only_sharded() -> None:
    """64 layers: 48 Gated DeltaNet (16 K / 48 V heads of 128, a conv of 4) and 16 gated attention
    layers (24 heads of 256, their query doubled by the gate; 4 KV heads), MLP 17,408, vocab 248,320;
    the vision tower of the published config is not the target."""
    h, v, mlp = 5120, 248_320, 17_408
    k_dim, v_dim = 16 * 128, 48 * 128
    conv = 2 * k_dim + v_dim
    linear = conv * h + v_dim * h + 2 * 48 * h + conv * 4 + 48 + 48 + 128 + v_dim * h
    full = 2 * 24 * 256 * h + 2 * 4 * 256 * h + 24 * 256 * h + 2 * 256
    layer_common = 3 * h * mlp + 2 * h
    expected = 2 * v * h + 48 * (linear + layer_common) + 16 * (full + layer_common) + h
    config = target_config(CONFIGS / "qwen3.6-27b-class.json")
    p = plan(config, Shape(layers=5, world=8, eval_batch_size=2), 80 * GiB)
    assert p.target == "Qwen3_5ForCausalLM"
    assert p.target_params == expected == 26_895_998_464
    assert p.trainable_params == _drafter(h, 24, 4, 256, mlp, 5, 5) == 1_835_072_000
    none, ddp, fsdp = (p.strategies[k] for k in ("none", "ddp", "fsdp"))
    assert not none.fits and not ddp.fits and fsdp.fits
    assert p.auto[0] == "fsdp" and fsdp.largest_batch >= 1 and ddp.largest_batch == 0
    n = p.trainable_params  # fsdp holds 1/8 of the float32 state: master, gradients, two moments
    assert (fsdp.terms["master copy"], fsdp.terms["gradients"], fsdp.terms["optimizer state"]) == (
        n * 4 // 8, n * 4 // 8, n * 8 // 8,
    )  # fmt: skip
    assert none.terms["target weights"] == expected * 2  # bf16, whole
    # fsdp shards the target: the layers / 8 and two whole layers in flight (the one computing, the
    # one prefetched), the embedding and head (untied) / 8 by vocabulary, the final norm whole
    layers = 48 * (linear + layer_common) + 16 * (full + layer_common)
    largest = max(linear, full) + layer_common
    assert layers % 8 == 0 and (2 * v * h) % 8 == 0
    assert fsdp.terms["target weights"] == (h + layers // 8 + 2 * v * h // 8 + 2 * largest) * 2


def test_plan_cli_prints_a_table_and_json() -> None:
    config = str(CONFIGS / "qwen3-8b.json")
    cmd = [sys.executable, "-m", "draftdeck.cli", "plan", "--target", config, "--devices", "2"]
    wide = {**os.environ, "COLUMNS": "100"}
    shown = subprocess.run(cmd, capture_output=True, text=True, check=True, env=wide)
    assert "per rank" in shown.stdout and "auto: ddp" in shown.stdout
    data = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout)
    assert set(data["strategies"]) == {"none", "ddp", "fsdp"} and data["target_params"] == 8_190_735_360
    fsdp = data["strategies"]["fsdp"]
    assert fsdp["per_rank_bytes"] == sum(fsdp["terms"].values()) and fsdp["fits"] is True
    bad = subprocess.run([*cmd, "--device-memory", "lots"], capture_output=True, text=True)
    assert bad.returncode == 2 and "'lots' is not a size" in bad.stderr


@pytest.mark.parametrize("text", ["80GiB", "80 GiB", "80Gi", "80G"])
def test_device_memory_reads_binary_sizes(text: str) -> None:
    from draftdeck.units import parse_size

    assert parse_size(text) == 80 * GiB and parse_size("80GB") == 80 * 10**9


def _eagle3(hidden: int, heads: int, kv: int, head_dim: int, mlp: int, draft_vocab: int) -> int:
    """EAGLE-3: fc from three target layers, one Llama layer whose q/k/v read 2H (the normed embedding
    beside the hidden state), its MLP, four norms, the head over the draft vocabulary; the embedding
    is the target's (frozen, not the drafter's)."""
    qkv = 2 * hidden * (heads + 2 * kv) * head_dim
    return (
        3 * hidden * hidden
        + qkv
        + heads * head_dim * hidden
        + 3 * hidden * mlp
        + 4 * hidden
        + draft_vocab * hidden
    )


def _tiny(tmp_path: Path) -> Path:
    """Qwen3-8B's config at a tiny size: 2 layers of 64, a 512-token vocabulary."""
    config = json.loads((CONFIGS / "qwen3-8b.json").read_text())
    config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=512, bos_token_id=0,
                  eos_token_id=1)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path / "config.json"


def test_an_eagle3_drafter_is_whole_per_rank_and_a_27b_target_needs_sharding(tmp_path: Path) -> None:
    """Qwen3-8B with 16,000 draft ids; the Qwen3.6-27B-class hybrid with the default 32,000: the
    target and a whole EAGLE-3 drafter with its TTT working set (7 steps over 4,096-token rows) do not
    fit one 80 GiB device, the sharded target does; the drafter's state is whole on every rank."""
    qwen = plan(
        target_config(CONFIGS / "qwen3-8b.json"), Shape(drafter="eagle3", draft_vocab_size=16_000), None
    )
    assert qwen.trainable_params == _eagle3(4096, 32, 8, 128, 12_288, 16_000) == 333_987_840
    assert (qwen.drafter, qwen.drafter_layers, qwen.draft_vocab_size) == ("eagle3", 1, 16_000)
    big = plan(target_config(_tiny(tmp_path)), Shape(drafter="eagle3"), None)
    assert big.draft_vocab_size == 512  # capped at the target's vocabulary
    config = target_config(CONFIGS / "qwen3.6-27b-class.json")
    p = plan(config, Shape(drafter="eagle3", world=8, eval_batch_size=2), 80 * GiB)
    n = p.trainable_params
    assert n == _eagle3(5120, 24, 4, 256, 17_408, 32_000) == 625_233_920
    ddp, fsdp = p.strategies["ddp"], p.strategies["fsdp"]
    assert not ddp.fits and fsdp.fits and p.auto[0] == "fsdp"
    for s in (ddp, fsdp):  # bf16 compute copy, float32 master, gradients and two moments, per rank
        assert [s.terms[k] for k in ("drafter weights", "master copy", "gradients", "optimizer state")] == [
            n * 2, n * 4, n * 4, n * 8,
        ]  # fmt: skip
    assert fsdp.terms["target weights"] < ddp.terms["target weights"] / 6  # the target is what fsdp splits
    assert ddp.terms["activations"] == fsdp.terms["activations"] > 20 * GiB  # 7 steps' tiles over the row
    # the target's view over the draft ids stands as the head's term: log-probs and probs per position
    assert ddp.terms["LM-head chunk"] == 4096 * 2 * 4 * 32_000
    dflash = plan(config, Shape(world=8, eval_batch_size=2), 80 * GiB)
    assert dflash.strategies["ddp"].fits  # the same target with a 1-layer DFlash drafter replicates


def test_a_train_run_asks_the_planner_for_either_kind(tmp_path: Path) -> None:
    """`--sharding auto` on N ranks: the trainer's question (`ddp_fits`) for an EAGLE-3 run plans an
    EAGLE-3 drafter (a tiny target fits this machine)."""
    import torch

    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.plan import ddp_fits, shape_of

    params = TrainParams(inputs=["x"], target="t", drafter="eagle3", ttt_steps=3, draft_vocab_size=100)
    shape = shape_of(params, seq_length=256, element_size=4, world=2)
    assert (shape.drafter, shape.ttt_steps, shape.draft_vocab_size) == ("eagle3", 3, 100)
    config = target_config(_tiny(tmp_path))
    assert ddp_fits(config, params, 256, torch.device("cpu"), 2, heldout_rows=4) is True


def test_a_kind_that_cannot_shard_is_planned_without_fsdp_and_refused_it_by_name() -> None:
    from pydantic import ValidationError

    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.sharding import choose_sharding
    from draftdeck.errors import UsageError

    config = target_config(CONFIGS / "qwen3-8b.json")
    for kind in ("dspark", "dflash2"):
        p = plan(config, Shape(drafter=kind, world=8, eval_batch_size=2), 80 * GiB)
        assert list(p.strategies) == ["none", "ddp"] and p.auto[0] == "ddp"
        tight = plan(config, Shape(drafter=kind, world=8, eval_batch_size=2), 8 * GiB)
        assert tight.auto == ("ddp", tight.auto[1]) and "fsdp cannot train this kind" in tight.auto[1]
        with pytest.raises(ValidationError, match="cannot shard"):
            TrainParams(inputs=["d"], target="t", out="o", drafter=kind, sharding="fsdp")
    assert "fsdp" in plan(config, Shape(world=8, eval_batch_size=2), 80 * GiB).strategies  # DFlash can
    with pytest.raises(UsageError, match=r"does not fit on one device replicated.*Markov"):
        choose_sharding("auto", 8, False, "its Markov head biases the target's head")
    assert choose_sharding("auto", 8, True, "its Markov head")[0] == "ddp"


def _gpt_oss(vocab: int, hidden: int, layers: int, heads: int, kv: int, head_dim: int, experts: int) -> int:
    """gpt-oss: biased q/k/v/o, a sink per head, a biased router, each expert's biased gate-up (2x) and
    down of `hidden` (its MLP width is the hidden size), two norms a layer, the final norm, an untied head."""
    attention = (
        hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2 + heads * head_dim + 2 * kv * head_dim
    )
    attention += hidden + heads  # o's bias, the sinks
    moe = hidden * experts + experts + experts * (hidden * 2 * hidden + 2 * hidden + hidden * hidden + hidden)
    return 2 * vocab * hidden + layers * (attention + moe + 2 * hidden) + hidden


def test_bundled_targets_plan_by_name_as_published() -> None:
    """Four popular targets' config.json ship in the package: any case, or the hub's name, plans one
    (the same figures as the fixtures' copies, and gpt-oss-120b's 116.8B counted by hand)."""
    from draftdeck.drafter.train.plan import resolve_target
    from draftdeck.drafter.train.targets import names

    assert names() == ["gpt-oss-120b", "llama-3.1-8b", "qwen3-8b", "qwen3.6-27b"]
    counted = {
        "QWEN3.6-27B": 26_895_998_464,
        "Qwen/Qwen3-8B": 8_190_735_360,
        "llama-3.1-8b": 8_030_261_248,
        "gpt-oss-120b": _gpt_oss(201_088, 2880, 36, 64, 8, 64, 128),
    }
    assert counted["gpt-oss-120b"] == 116_829_156_672
    for name, params in counted.items():
        path, said = resolve_target(name)
        assert path.is_file() and said is not None and "config.json" in said
        assert plan(target_config(name), Shape(world=8), None).target_params == params, name
    with pytest.raises(
        UsageError, match=r"no bundled target .*gpt-oss-120b, llama-3.1-8b, qwen3-8b, qwen3.6-27b"
    ):
        target_config("qwen9-1t")


def test_nothing_fits_says_so_and_what_would_each_lever_alone_exactly() -> None:
    """Each advised value fits when planned on its own, and the next one past it does not: the advice
    is the planner's own figure, not a rule of thumb."""
    from draftdeck.drafter.train.params import PlanParams
    from draftdeck.drafter.train.plan_advice import plan_for

    base = PlanParams(target="qwen3-8b", layers=8, devices=1, device_memory="40GiB")
    p = plan_for(base)
    assert not p.fits and p.to_dict()["fits"] is False
    advised = {a.lever: a for a in p.advice}
    assert advised["devices"].flags == "--devices 3" and advised["layers"].flags == "--layers 1"
    for lever, fit, past in (("devices", 3, 2), ("layers", 1, 2)):
        assert plan_for(base.model_copy(update={lever: fit})).fits, lever
        assert not plan_for(base.model_copy(update={lever: past})).fits, lever
    assert plan_for(base.model_copy(update={"devices": 8})).advice == []  # it fits: no advice
    eagle3 = PlanParams(target="qwen3.6-27b", drafter="eagle3", devices=1)
    advised = {a.lever: a for a in plan_for(eagle3).advice}
    assert "layers" not in advised  # EAGLE-3 has one layer
    length = int(advised["seq_length"].flags.split()[-1])
    assert length % 256 == 0 and plan_for(eagle3.model_copy(update={"seq_length": length})).fits
    assert not plan_for(eagle3.model_copy(update={"seq_length": length + 256})).fits


def test_plan_cli_exits_1_when_nothing_fits_with_the_advice() -> None:
    """The EAGLE-3 plan of the issue: a 27B target on one 80 GiB device no longer says `auto` and exits 0;
    a bundled target's name is enough."""
    cmd = [sys.executable, "-m", "draftdeck.cli", "plan", "--target", "qwen3.6-27b", "--drafter", "eagle3",
           "--devices", "1"]  # fmt: skip
    shown = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 1, shown.stderr
    assert "DraftDeck's copy of Qwen/Qwen3.6-27B's config.json" in shown.stdout
    assert "nothing fits 80GiB per device" in shown.stdout and "auto:" not in shown.stdout
    assert "more devices: 3 ranks (--devices 3) fit (fsdp" in shown.stdout
    assert "--seq-length" in shown.stdout and "cached" not in shown.stdout  # no mode that does not exist
    data = subprocess.run([*cmd, "--json"], capture_output=True, text=True)
    assert data.returncode == 1
    said = json.loads(data.stdout)
    assert said["fits"] is False and said["advice"][0]["flags"] == "--devices 3"
