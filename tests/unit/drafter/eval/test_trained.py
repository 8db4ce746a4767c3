"""A checkpoint from the real trainer, evaluated on a dataset folder's held-out split: the run folder
resolves to its best checkpoint, decoding is lossless, the walked tau of the checkpoint equals real
greedy tau on the target's own outputs (no tau_mismatch alert), and the run exports to z-lab's format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.eval.evaluate import run_eval
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.spec_decode import TargetRunner, generate_plain
from draftdeck.drafter.export.drafters import export_drafter
from draftdeck.drafter.export.folder import resolve_checkpoint
from draftdeck.drafter.kinds.dflash.export import load_zlab
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import write_dataset
from tests.support.eval import build_world

torch.set_num_threads(1)
MAX_NEW = 32


@pytest.mark.slow
def test_trained_checkpoint_on_the_heldout_split_walked_equals_real(tmp_path: Path) -> None:
    world = build_world(tmp_path / "world", n_prompts=40)
    runner = TargetRunner(world.target, [world.eos_id])
    rows = []
    for ids in world.prompt_ids:
        out = generate_plain(runner, ids, MAX_NEW).output_ids
        rows.append((ids + out, [0] * len(ids) + [1] * len(out)))
    data = write_dataset(tmp_path / "data", rows, world.target_dir)
    run = tmp_path / "run"
    train(
        TrainParams(
            inputs=[str(data)],
            target=str(world.target_dir),
            out=str(run),
            block_size=4,
            lr=3e-3,
            max_steps=30,
            batch_size=8,
            anchors_per_seq=16,
            checkpoint_every=15,
            eval_every=15,
            heldout_fraction=0.3,
            device="cpu",
        ),
        LocalContext(tmp_path / "train-job"),
    )
    best = resolve_checkpoint(run)
    assert best.parent == run / "checkpoints" and (best / "model.safetensors").is_file()

    ctx = LocalContext(tmp_path / "eval-job")
    params = EvalParams(
        inputs=data, target=world.target_dir, checkpoint=run, max_new_tokens=MAX_NEW, heldout_fraction=0.3
    )
    report = run_eval(params, ctx)
    ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    assert 3 <= report.rows_out < 40  # the held-out conversations only
    real = ev["methods"]["drafter"]
    assert real["lossless"] is True
    assert real["tau_incl_bonus_pooled"] > ev["methods"]["untrained"]["tau_incl_bonus_pooled"]
    assert (ev["walked"]["accepted"], ev["walked"]["steps"]) == (
        real["counts"]["accepted"],
        real["counts"]["verify_steps"],
    )
    assert ctx.alerts == []

    exported, _ = export_drafter(run, tmp_path / "export")
    a, b = load_zlab(exported), load_zlab(best)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
