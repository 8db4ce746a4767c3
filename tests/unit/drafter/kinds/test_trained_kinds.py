"""DSpark and DFlash2 through the real trainer, eval and export: the run learns (walked tau above the
untrained drafter's), real decoding is lossless and accepts exactly what the held-out walk counted on the
target's own answers, DSpark's confidence scheduling is reported beside it (lossless, fewer drafts a
step), and the export in speculators' format loads back weight for weight."""

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
from draftdeck.errors import UsageError
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import write_dataset
from tests.support.eval import build_world

torch.set_num_threads(1)
MAX_NEW = 32


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The target's own greedy answers to 40 prompts, as a tokenized dataset."""
    root = tmp_path_factory.mktemp("world")
    world = build_world(root / "world", n_prompts=40)
    runner = TargetRunner(world.target, [world.eos_id])
    rows = []
    for ids in world.prompt_ids:
        out = generate_plain(runner, ids, MAX_NEW).output_ids
        rows.append((ids + out, [0] * len(ids) + [1] * len(out)))
    return write_dataset(root / "data", rows, world.target_dir), world.target_dir


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "options", "drafts"),
    [("dspark", {"markov_rank": 16}, 4), ("dflash2", {"selector_rank": 16, "selector_top_k": 4}, 3)],
)
def test_a_new_kind_trains_decodes_losslessly_as_walked_and_exports(
    data: tuple[Path, Path], tmp_path: Path, kind: str, options: dict[str, int], drafts: int
) -> None:
    dataset, target = data
    run = tmp_path / "run"
    train_ctx = LocalContext(tmp_path / "train-job")
    train(
        TrainParams(
            inputs=[str(dataset)], target=str(target), out=str(run), drafter=kind, block_size=4, lr=3e-3,
            max_steps=30, batch_size=8, anchors_per_seq=16, checkpoint_every=15, eval_every=15,
            heldout_fraction=0.3, device="cpu", **options,
        ),
        train_ctx,
    )  # fmt: skip
    assert f"drafter: {'DSpark' if kind == 'dspark' else 'DFlash2'}" in " ".join(
        str(e) for e in train_ctx.events
    )
    threshold = 0.3 if kind == "dspark" else None
    ctx = LocalContext(tmp_path / "eval-job")
    params = EvalParams(
        inputs=dataset, target=target, checkpoint=run, max_new_tokens=MAX_NEW, heldout_fraction=0.3,
        confidence_threshold=threshold,
    )  # fmt: skip
    run_eval(params, ctx)
    ev = json.loads((ctx.out_dir / "eval.json").read_text())["eval"]
    assert ev["drafter"] == kind
    real = ev["methods"]["drafter"]
    assert real["lossless"] is True
    assert real["tau_incl_bonus_pooled"] > ev["methods"]["untrained"]["tau_incl_bonus_pooled"] + 0.5
    # the walk judged by the target is real decoding on the target's own answers, count for count
    assert (ev["walked"]["accepted"], ev["walked"]["steps"]) == (
        real["counts"]["accepted"],
        real["counts"]["verify_steps"],
    )
    if threshold is not None:  # scheduled: as lossless, never more drafts a step than the block
        scheduled = ev["methods"]["drafter_scheduled"]
        assert scheduled["lossless"] is True
        rate = [m["counts"]["proposed"] / m["counts"]["verify_steps"] for m in (scheduled, real)]
        assert rate[0] < rate[1] <= drafts, rate
    else:  # a kind without a confidence head refuses the option by name, never decodes as if it had one
        assert "drafter_scheduled" not in ev["methods"]
        with pytest.raises(UsageError, match="DFlash2 drafter, has no confidence head"):
            run_eval(params.model_copy(update={"confidence_threshold": 0.5}), LocalContext(tmp_path / "e2"))
    assert ctx.alerts == []

    exported, fmt = export_drafter(run, tmp_path / "export")
    config = json.loads((exported / "config.json").read_text())
    assert fmt == "speculators" and config["speculators_model_type"] == kind
    a, b = load_drafter(exported), load_drafter(resolve_checkpoint(run))
    assert type(a) is type(b) and a.slots == b.slots == drafts + 1
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
