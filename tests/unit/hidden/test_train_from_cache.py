"""A run from a hidden-state cache trains as the online run does: the same losses and counts, bit-equal
on the CPU at fp32 (DFlash and EAGLE-3, a few steps on the tiny world), without the target's decoder
layers in memory; a cache of another target, another tokenization or missing a kind's layers is
refused before any step, naming what differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from app.web.job_views import default_text, form_fields, form_params
from draftdeck.cli.options import job_command
from draftdeck.drafter.model.cached_target import NO_TRUTH_FROM_CACHE, CachedTarget
from draftdeck.drafter.train.params import TrainParams
from draftdeck.hidden.store import MANIFEST, CacheError
from tests.unit.hidden.conftest import train_run, vllm_files


def _run(world: dict[str, Path], name: str, drafter: str, cache: Path | None) -> tuple[list, dict]:
    # the online run turns the truth checks off; the cached one leaves truth_rows alone (0 from a cache)
    given: dict[str, object] = {"hidden_states": str(cache)} if cache else {"truth_rows": 0}
    points, run, ctx = train_run(world, name, drafter, **given)
    said = [m for level, m, _, _ in ctx.events if level == "info" and m == NO_TRUTH_FROM_CACHE]
    assert len(said) == (1 if cache else 0)  # why the truth checks are off, once
    return points, run


@pytest.mark.parametrize("drafter", ["dflash", "eagle3"])
def test_a_run_from_the_cache_equals_the_online_run(
    world: dict[str, Path], cache: Path, drafter: str
) -> None:
    online, run_online = _run(world, f"online-{drafter}", drafter, None)
    cached, run_cached = _run(world, f"cached-{drafter}", drafter, cache)
    assert any(name == "train/loss" for _, name, _ in online)
    assert any(name.startswith("heldout/") for _, name, _ in online)
    assert cached == online  # every loss and count, bit for bit
    assert run_cached["steps_done"] == run_online["steps_done"] == 3


def test_files_written_as_vllm_writes_them_train_as_the_online_run(
    world: dict[str, Path], tmp_path: Path
) -> None:
    """vLLM's hs_<i>.safetensors (its layer order, not ours), taken in with --import, train a DFlash run
    whose every loss and count equals the online run's."""
    from draftdeck.drafter.train.cache.job import run_cache_hidden
    from draftdeck.drafter.train.cache.params import CacheParams
    from draftdeck.jobs.context import LocalContext

    vllm_files(world, tmp_path / "vllm", [2, 1, 0])
    imported = tmp_path / "imported"
    params = CacheParams(
        inputs=[str(world["ds"])], target=str(world["target"]), out=str(imported), dtype="fp32",
        import_from=str(tmp_path / "vllm"), stored_layers=[2, 1, 0],
    )  # fmt: skip
    run_cache_hidden(params, LocalContext(tmp_path / "ctx"))
    online, _ = _run(world, "online-dflash-vllm", "dflash", None)
    cached, _ = _run(world, "imported-dflash", "dflash", imported)
    assert any(name == "train/loss" for _, name, _ in online) and cached == online


def test_the_cached_target_holds_no_decoder_layer(world: dict[str, Path], cache: Path) -> None:
    t = CachedTarget.open(cache, world["target"])
    names = [n for n, _ in t.model.named_parameters()]
    assert names == ["embed_tokens.weight", "lm_head.weight"]
    assert t.num_layers == 2  # the target's config, all the same


def test_a_cache_of_other_inputs_is_refused_naming_what_differs(
    world: dict[str, Path], cache: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(cache, other)
    mf = json.loads((other / MANIFEST).read_text())
    mf["datasets"][0]["manifest_sha256"] = "0" * 64
    (other / MANIFEST).write_text(json.dumps(mf))
    with pytest.raises(CacheError, match="another tokenization"):
        _run(world, "refused-ds", "dflash", other)
    mf = json.loads((cache / MANIFEST).read_text())
    mf["target_fingerprint"] = "sha256:another"
    (other / MANIFEST).write_text(json.dumps(mf))
    with pytest.raises(CacheError, match=r"built from the target .*sha256:another"):
        _run(world, "refused-target", "dflash", other)
    mf = json.loads((cache / MANIFEST).read_text())
    mf["layers"] = [2]  # the final layer alone
    (other / MANIFEST).write_text(json.dumps(mf))
    with pytest.raises(
        CacheError, match=r"the drafter reads target layers \[0\] .* holds hidden_states \[2\]"
    ):
        _run(world, "refused-layers", "dflash", other)


def test_a_run_from_the_cache_turns_off_the_truth_checks_unless_asked_for_them(
    world: dict[str, Path], cache: Path
) -> None:
    """truth_rows left alone is 0 from a cache (the API's JSON, the CLI's options, the form's prefilled
    default: none of them the user's); truth_rows given above 0, or fsdp, is refused by name."""
    base = {"inputs": [str(world["ds"])], "target": str(world["target"]), "hidden_states": str(cache)}
    assert TrainParams(**base).truth_rows == 0
    assert TrainParams(**{k: v for k, v in base.items() if k != "hidden_states"}).truth_rows == 64
    with pytest.raises(ValueError, match=r"own answers \(truth_rows 64: set 0\)"):
        TrainParams(**base, truth_rows=64)
    with pytest.raises(ValueError, match=r"to shard \(sharding fsdp\)"):
        TrainParams(**base, sharding="fsdp")

    got: list[TrainParams] = []
    app = typer.Typer()
    app.command("train")(
        job_command(TrainParams, lambda params, **_: got.append(params), required=("out",), doc="train")
    )
    args = [str(world["ds"]), "--target", str(world["target"]), "--hidden-states", str(cache), "--out", "r"]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert got[0].truth_rows == 0
    refused = CliRunner().invoke(app, [*args, "--truth-rows", "64"])
    assert refused.exit_code != 0 and "truth_rows 64: set 0" in refused.output

    shown = {f["name"]: default_text(f) for f in form_fields("train")}  # the form as first shown
    typed = {"inputs": str(world["ds"]), "target": str(world["target"]), "hidden_states": str(cache)}
    posted, _ = form_params("train", {**shown, **typed})
    assert TrainParams.model_validate(posted).truth_rows == 0
    with pytest.raises(ValueError, match="truth_rows 8: set 0"):
        TrainParams.model_validate(form_params("train", {**shown, **typed, "truth_rows": "8"})[0])
