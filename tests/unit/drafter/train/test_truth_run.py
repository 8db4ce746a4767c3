"""The issue's table at test size: two tiny targets that count differently, a drafter trained on each
one's greedy answers to the same prompts and evaluated against the first. On the target's own answers
nothing is raised and the target-judged tau is real tau; on the other's, `data_not_target_output`
comes before step 1 (the manifest says who answered, and the target disagrees with the data) and
again at the eval (the data-judged tau is above real decoding, the target-judged one is not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.versus import run_figures
from draftdeck.drafter.train.data import TrainData
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.preflight import OFF_TARGET, compare
from draftdeck.drafter.train.run import train
from draftdeck.errors import JobFailed
from draftdeck.jobs.context import LocalContext
from draftdeck.provenance import Answered, ModelIdentity
from draftdeck.shards.manifest import MANIFEST, read_manifest
from draftdeck.shards.store import write_metadata
from tests.support.drafter import greedy_text, learnable_target, write_dataset

torch.set_num_threads(1)
N = 40


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("truth")
    target = learnable_target(root / "target", steps=80, seed=0)
    other = learnable_target(root / "other", steps=80, seed=1, stride=5)  # counts by five
    out = {"target": target, "other_model": other}
    for name, writer in (("own", target), ("other", other)):
        rows = greedy_text(writer, N, gen_len=24, seed=2)  # the same prompts, each model's answer
        ds = write_dataset(root / f"ds-{name}", rows, target)
        mf = read_manifest(ds)  # what tokenize writes for regenerated rows: who answered them
        mf.provenance = Answered(((ModelIdentity.of_folder(writer), N),), 0)
        (ds / MANIFEST).unlink()
        write_metadata(ds, mf)
        out[name] = ds
    return out


def _train(world: dict[str, Path], name: str, tmp: Path, **kw: Any) -> tuple[LocalContext, Path]:
    ctx = LocalContext(tmp / f"job-{name}")
    run = tmp / f"run-{name}"
    params = TrainParams(inputs=[str(world[name])], target=str(world["target"]), out=str(run), block_size=4,
                         lr=3e-3, max_steps=30, batch_size=8, anchors_per_seq=16, checkpoint_every=15,
                         eval_every=15, heldout_fraction=0.3, truth_rows=16, device="cpu", **kw)  # fmt: skip
    train(params, ctx)
    return ctx, run


def _eval(world: dict[str, Path], name: str, run: Path, tmp: Path) -> tuple[LocalContext, dict[str, Any]]:
    ctx = LocalContext(tmp / f"eval-{name}")
    run_eval(EvalParams(inputs=[str(world[name])], target=str(world["target"]), checkpoint=str(run),
                        max_new_tokens=24, heldout_fraction=0.3), ctx)  # fmt: skip
    return ctx, json.loads((ctx.out_dir / "eval.json").read_text())["eval"]


def test_on_the_targets_own_answers_nothing_is_raised_and_both_walks_are_real_tau(
    world: dict[str, Path], tmp_path: Path
) -> None:
    ctx, run = _train(world, "own", tmp_path)
    assert ctx.alerts == []
    events = [m for _, m, _, _ in ctx.events]
    assert f"provenance: {N} of {N} rows were answered by this target" in events
    pre = {name: ctx.total(f"preflight/agreement/{name}") for name in ("tokens", "matches")}
    assert pre["tokens"] > 0 and pre["matches"] == pre["tokens"]  # its own greedy tokens
    figures = run_figures(run)
    assert figures is not None and figures.entry["heldout_target_walked_steps"] > 0
    heldout = TrainData([world["own"]], heldout_fraction=0.3).heldout  # the rows whose prompts it answered
    assert figures.answered == {(str(world["own"].resolve()), r.row) for r in heldout[:16]}
    ev_ctx, ev = _eval(world, "own", run, tmp_path)
    assert ev_ctx.alerts == []
    real = ev["methods"]["drafter"]["tau_incl_bonus_pooled"]
    assert ev["training"]["target_judged_tau_incl_bonus"] == pytest.approx(real, rel=0.05)
    assert ev["training"]["data_judged_tau_incl_bonus"] == pytest.approx(real, rel=0.05)


def test_on_another_models_answers_the_run_and_the_eval_say_so(
    world: dict[str, Path], tmp_path: Path
) -> None:
    ctx, run = _train(world, "other", tmp_path)
    kinds = [k for k, _ in ctx.alerts]
    assert kinds == [OFF_TARGET]  # before step 1, once
    message = ctx.alerts[0][1]
    assert f"{N:,} of {N:,} rows are recorded as another model's answers" in message
    other = world["other_model"].resolve()
    assert f"0 of {N} rows were answered by this target ({N} by local model {other} (sha256:" in message
    assert "above off_target_ratio 1.25" in message and "regenerate --local" in message
    assert ctx.series("preflight/agreement/tokens")[0][0] == 0  # the pre-flight's step
    ev_ctx, ev = _eval(world, "other", run, tmp_path)
    assert [k for k, _ in ev_ctx.alerts] == [OFF_TARGET]
    t = ev["training"]
    real = t["real_tau_incl_bonus"]
    assert t["data_judged_tau_incl_bonus"] > real * 1.05  # the live tau judged by the data overstates
    assert t["target_judged_tau_incl_bonus"] == pytest.approx(real, rel=0.10)
    for figure in (real, t["data_judged_tau_incl_bonus"], t["target_judged_tau_incl_bonus"]):
        assert f"{figure:.3f}" in ev_ctx.alerts[0][1]


def test_a_policy_makes_off_target_data_fatal_before_step_1(world: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(JobFailed, match="off_target is 'fail': the run stopped before step 1"):
        _train(world, "other", tmp_path, off_target="fail")
    assert not (tmp_path / "run-other" / "checkpoints").exists()


def test_the_training_comparison_alerts_when_the_data_judged_walk_runs_ahead() -> None:
    from draftdeck.drafter.train.counts import Counts

    params = TrainParams(inputs=["d"], target="t", off_target_tolerance=0.05)  # the default is 0.10
    data, own = (
        Counts(4, walked_accepted=150, walked_steps=100),
        Counts(4, walked_accepted=100, walked_steps=100),
    )
    message = compare(data, own, params, step=200)
    assert message is not None and "at step 200" in message and "2.500" in message and "2.000" in message
    assert compare(Counts(4, walked_accepted=104, walked_steps=100), own, params, step=200) is None
    assert compare(own, data, params, step=200) is None  # judged by the data below: the target's samples
