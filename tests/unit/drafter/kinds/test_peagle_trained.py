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
