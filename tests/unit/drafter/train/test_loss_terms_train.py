"""Every drafter kind trains with the mix's distribution losses: a few steps of the tiny DFlash and
EAGLE-3 runs with `--loss tv` and `lk_hybrid` (CPU) end with a finite loss that fell, and run.json
records the loss as given and in words."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import run_train
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import greedy_text, learnable_target, write_dataset

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("loss_terms")
    target = learnable_target(root / "target")
    return target, write_dataset(root / "ds", greedy_text(target, 32), target)


@pytest.mark.parametrize(
    ("drafter", "loss", "words"),
    [
        ("dflash", "tv", "(1 - sum min(p, q))_k"),
        ("dflash", "lk_hybrid", "lambda = exp(-2 sg[sum min(p, q)])"),
        ("eagle3", "tv", "1 x (1 - sum min(p, q))"),
        ("eagle3", "0.5*ce+lk_hybrid", "0.5 x CE(data's draft id) + 1 x (lambda KL"),
    ],
)
def test_each_kind_trains_with_a_distribution_loss(
    prepared: tuple[Path, Path], tmp_path: Path, drafter: str, loss: str, words: str
) -> None:
    target, ds = prepared
    shape = (
        {"block_size": 4, "anchors_per_seq": 8}
        if drafter == "dflash"
        else {"ttt_steps": 2, "draft_vocab_size": 20}
    )
    params = TrainParams(
        inputs=[str(ds)], target=str(target), out=str(tmp_path / "run"), drafter=drafter, loss=loss,
        lk_eta=2.0, layers=1, batch_size=8, lr=1e-2, max_steps=8, checkpoint_every=8, eval_every=8,
        log_every=2, heldout_fraction=0.15, device="cpu", **shape,
    )  # fmt: skip
    ctx = LocalContext(tmp_path / "ctx")
    run_train(params, ctx)
    values = [v for _, v in ctx.series("train/loss")]
    assert all(math.isfinite(v) for v in values) and values[-1] < values[0], values
    run = json.loads((tmp_path / "run/run.json").read_text())
    assert words in run["loss"], run["loss"]
    assert run["provenance"]["parameters"]["loss"] == loss
    assert run["provenance"]["parameters"]["lk_eta"] == 2.0
