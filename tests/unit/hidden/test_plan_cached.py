"""`draftdeck plan --hidden-states`: a run from the cache holds of the target its embedding and LM head
alone (the bytes a CachedTarget holds), has no fsdp column, and the cache's disk is rows x tokens x
layers x hidden x bytes, checked by hand on the tiny world."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftdeck.causal_lm import causal_lm_config
from draftdeck.cli import app
from draftdeck.drafter.model.cached_target import CachedTarget
from draftdeck.drafter.train.cache.size import ZSTD_RATIO, ZSTD_RATIOS
from draftdeck.drafter.train.memory import params_bytes
from draftdeck.drafter.train.params import PlanParams
from draftdeck.drafter.train.plan_advice import plan_for
from draftdeck.hidden.store import read_manifest
from draftdeck.shards.store import ShardDataset


def _params(world: dict[str, Path], **kw: object) -> PlanParams:
    return PlanParams.model_validate(
        {"target": str(world["target"]), "devices": 1, "dtype": "float32", "device_memory": "80GiB",
         "target_layer_ids": [0], "block_size": 4, **kw}
    )  # fmt: skip


def test_the_cached_plan_holds_the_embedding_and_head_alone(world: dict[str, Path], cache: Path) -> None:
    config = causal_lm_config(world["target"])
    assert not config.tie_word_embeddings  # so the head is a matrix of its own
    online = plan_for(_params(world)).strategies["none"].terms
    cached = plan_for(_params(world, hidden_states=True)).strategies["none"].terms
    by_hand = 2 * config.vocab_size * config.hidden_size * 4  # embedding + head, float32
    assert cached["target weights"] == by_hand
    assert cached["target weights"] == params_bytes(CachedTarget.open(cache, world["target"]).model)
    assert online["target weights"] > by_hand  # the decoder layers and the norms besides
    assert {k: v for k, v in cached.items() if k != "target weights"} == {
        k: v for k, v in online.items() if k != "target weights"
    }
    two = plan_for(_params(world, hidden_states=True, devices=2))
    assert list(two.strategies) == ["none", "ddp"]  # train refuses fsdp from a cache
    assert "fsdp" in plan_for(_params(world, devices=2)).strategies


def test_the_cache_disk_by_hand(world: dict[str, Path], cache: Path) -> None:
    config = causal_lm_config(world["target"])
    lengths = ShardDataset(world["ds"]).lengths()
    rows, tokens = len(lengths), int(sum(min(int(n), 4096) for n in lengths))
    # target layer 0 is hidden_states[1]; the final layer hidden_states[2] last: 2 layers, bf16
    disk = plan_for(_params(world, hidden_states=True, cache_dataset=[str(world["ds"])])).cache_disk
    assert disk is not None and disk.layers == [1, 2] and (disk.rows, disk.tokens) == (rows, tokens)
    assert disk.bytes == tokens * 2 * config.hidden_size * 2
    assert disk.zstd_bytes == int(disk.bytes / ZSTD_RATIO)  # bf16's measured ratio
    built = read_manifest(cache)  # the cache cache-hidden built of the same rows: the same tokens
    assert (built.rows, built.tokens) == (rows, tokens)
    short = plan_for(
        _params(world, hidden_states=True, cache_dataset=[str(world["ds"])], seq_length=8, cache_dtype="fp32")
    ).cache_disk
    assert short is not None and short.bytes == int(sum(min(int(n), 8) for n in lengths)) * 2 * 64 * 4
    assert short.zstd_bytes == int(short.bytes / ZSTD_RATIOS["fp32"])  # fp32's own measured ratio
    assert short.disk_bytes == short.bytes  # not compressed: the disk check reads the whole figure
    packed = plan_for(
        _params(world, hidden_states=True, cache_dataset=[str(world["ds"])], cache_compress="zstd")
    )
    assert packed.cache_disk is not None and packed.cache_disk.disk_bytes == disk.zstd_bytes
    assert "stored with zstd:3" in packed.cache_disk.said()
    one = plan_for(_params(world, hidden_states=True, seq_length=1000)).cache_disk
    assert one is not None and (one.rows, one.bytes) == (1, 1000 * 2 * config.hidden_size * 2)


def test_the_plan_command_says_the_cached_run_and_its_disk(world: dict[str, Path]) -> None:
    base = ["plan", "--target", str(world["target"]), "--devices", "1", "--target-layer-ids", "0"]
    said = CliRunner().invoke(app, [*base, "--hidden-states", "--cache-dataset", str(world["ds"])])
    assert said.exit_code == 0, said.output
    text = " ".join(said.output.split())  # as wrapped to the terminal
    assert "from a hidden-state cache" in text and "2 layers x 64 hidden x 2 bytes (bf16)" in text
    got = CliRunner().invoke(app, [*base, "--hidden-states", "--json"])
    assert got.exit_code == 0 and json.loads(got.output)["hidden_states"]["cache_disk"]["layers"] == [1, 2]
    refused = CliRunner().invoke(app, [*base, "--cache-dataset", str(world["ds"])])
    assert refused.exit_code != 0 and "give hidden_states" in " ".join(refused.output.split())
    with pytest.raises(ValueError, match="cache_dtype: the cache's options"):
        _params(world, cache_dtype="fp32")
