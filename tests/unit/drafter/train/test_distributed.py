"""Two gloo ranks on the CPU train the same curve as one rank at the same global batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.errors import Cancelled
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import greedy_text, learnable_target, write_dataset

torch.set_num_threads(1)


def _params(target: Path, ds: Path, out: Path, devices: int, batch: int, steps: int = 8) -> TrainParams:
    return TrainParams(
        inputs=[str(ds)], target=str(target), out=str(out), block_size=4, anchors_per_seq=8, batch_size=batch,
        lr=1e-2, max_steps=steps, checkpoint_every=4, eval_every=4, log_every=2, heldout_fraction=0.15,
        devices=devices, device="cpu",
    )  # fmt: skip


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_rank_and_counts_are_summed(tmp_path: Path) -> None:
    target = learnable_target(tmp_path / "target")
    ds = write_dataset(tmp_path / "ds", greedy_text(target, 48), target)
    one, two = LocalContext(tmp_path / "c1"), LocalContext(tmp_path / "c2")
    train(_params(target, ds, tmp_path / "r1", devices=1, batch=8), one)
    record = train(_params(target, ds, tmp_path / "r2", devices=2, batch=4), two)
    assert record.world_size == 2 and record.global_batch == 8
    a, b = one.series("train/loss"), two.series("train/loss")
    assert [s for s, _ in a] == [s for s, _ in b] == [2, 4, 6, 8]
    for (_, x), (_, y) in zip(a, b, strict=True):
        assert y == pytest.approx(x, rel=1e-3)
    for name in ("train/pos/1/total", "train/pos/3/correct", "heldout/walked/steps", "heldout/anchor/blocks"):
        assert two.series(name) == one.series(name), name  # counts reduced as counts: exact
    assert (tmp_path / "r2/checkpoints/step-00000008/model.safetensors").is_file()

    class CancelAt(LocalContext):
        def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
            if done == 2:
                self.cancel()
            super().progress(done, total, unit)

    ctx = CancelAt(tmp_path / "c3")
    with pytest.raises(Cancelled):
        train(_params(target, ds, tmp_path / "r3", devices=2, batch=4, steps=50), ctx)
    assert max(s for s, _ in ctx.series("train/loss")) <= 4  # every rank stopped together, soon
