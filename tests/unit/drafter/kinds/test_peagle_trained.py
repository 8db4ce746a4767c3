"""P-EAGLE through the real trainer, eval and export: the run learns (real tau above the untrained
drafter's), real decoding is lossless and accepts exactly what the held-out walk judged by the target
counted on its own answers, and the export in speculators' format loads back weight for weight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.spec_decode import TargetRunner, generate_plain
from draftdeck.drafter.export.drafters import export_drafter, load_drafter
from draftdeck.drafter.export.folder import resolve_checkpoint
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import write_dataset
from tests.support.eval import build_world

torch.set_num_threads(1)
MAX_NEW, DRAFTS = 32, 4


@pytest.mark.slow
def test_peagle_trains_decodes_losslessly_as_walked_and_exports(tmp_path: Path) -> None:
    world = build_world(tmp_path / "world", n_prompts=40)
    runner = TargetRunner(world.target, [world.eos_id])
    rows = []
    for ids in world.prompt_ids:  # the target's own greedy answers
        out = generate_plain(runner, ids, MAX_NEW).output_ids
        rows.append((ids + out, [0] * len(ids) + [1] * len(out)))
    dataset, target = write_dataset(tmp_path / "data", rows, world.target_dir), world.target_dir
    run = tmp_path / "run"
    train_ctx = LocalContext(tmp_path / "train-job")
    train(
        TrainParams(
            inputs=[str(dataset)], target=str(target), out=str(run), drafter="peagle", num_depths=DRAFTS,
            lr=3e-3, max_steps=30, batch_size=8, checkpoint_every=15, eval_every=15, heldout_fraction=0.3,
            device="cpu",
        ),
        train_ctx,
    )  # fmt: skip
    assert "drafter: P-EAGLE, 4 parallel drafts" in " ".join(str(e) for e in train_ctx.events)
    ctx = LocalContext(tmp_path / "eval-job")
    params = EvalParams(
        inputs=dataset, target=target, checkpoint=run, max_new_tokens=MAX_NEW, heldout_fraction=0.3
    )
    run_eval(params, ctx)
    ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    assert ev["drafter"] == "peagle"
    real = ev["methods"]["drafter"]
    assert real["lossless"] is True
    assert real["tau_incl_bonus_pooled"] > ev["methods"]["untrained"]["tau_incl_bonus_pooled"] + 0.5
    # the walk judged by the target is real decoding on the target's own answers, count for count
    assert (ev["walked"]["accepted"], ev["walked"]["steps"]) == (
        real["counts"]["accepted"],
        real["counts"]["verify_steps"],
    )
    assert real["counts"]["proposed"] <= DRAFTS * real["counts"]["verify_steps"]
    assert ctx.alerts == []
    exported, fmt = export_drafter(run, tmp_path / "export")
    config = json.loads((exported / "config.json").read_text())
    assert fmt == "speculators" and config["speculators_model_type"] == "peagle"
    a, b = load_drafter(exported), load_drafter(resolve_checkpoint(run))
    assert type(a) is type(b) and a.config == b.config and a.config.num_depths == DRAFTS
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_ranks_train_as_one_rank(tmp_path: Path, sharding: str) -> None:
    """Over 2 gloo ranks (each half the batch, each row's COD sampling drawn from its own generator; the
    drafter whole on each, its gradients summed; under fsdp the target split): the same losses, counts
    and weights as one rank at the same global batch."""
    from safetensors.torch import load_file

    from tests.support.drafter import greedy_text, learnable_target

    target = learnable_target(tmp_path / "target")
    ds = write_dataset(tmp_path / "ds", greedy_text(target, 24), target)
    base = TrainParams(
        inputs=[str(ds)], target=str(target), drafter="peagle", num_depths=3, draft_vocab_size=20,
        batch_size=8, lr=1e-2, max_steps=4, checkpoint_every=4, eval_every=4, heldout_fraction=0.15,
        device="cpu", sharding=sharding,
    )  # fmt: skip
    one, two = LocalContext(tmp_path / "c1"), LocalContext(tmp_path / "c2")
    train(base.model_copy(update={"out": str(tmp_path / "r1"), "sharding": "auto"}), one)
    record = train(base.model_copy(update={"out": str(tmp_path / "r2"), "devices": 2, "batch_size": 4}), two)
    assert record.sharding["strategy"] == sharding and "P-EAGLE" in record.sharding["why"]
    for name in ("train/loss", "heldout/loss"):
        a, b = dict(one.series(name)), dict(two.series(name))
        assert a and sorted(a) == sorted(b) and all(b[s] == pytest.approx(a[s], rel=1e-4) for s in a), name
    for name in ("train/pos/1/total", "train/pos/3/total", "heldout/walked/steps", "heldout/walked/accepted"):
        assert one.series(name) and one.series(name) == two.series(name), name
    w1 = load_file(str(tmp_path / "r1/checkpoints/step-00000004/model.safetensors"))
    w2 = load_file(str(tmp_path / "r2/checkpoints/step-00000004/model.safetensors"))
    assert all(torch.allclose(w1[k].float(), w2[k].float(), atol=1e-5) for k in w1)
