"""N gloo ranks on the CPU train the same curve as one rank at the same global batch, whatever the
sharding; a run resumes on another number of ranks and continues as if it had not stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.errors import Cancelled
from draftdeck.jobs.context import LocalContext
from tests.support.drafter import greedy_text, learnable_target, write_dataset

torch.set_num_threads(1)
STEPS = 8
World = tuple[Path, Path, Path, LocalContext]  # target, dataset, the one-rank run's folder and its points


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, LocalContext]:
    """The target, the dataset, and the reference: one rank, 8 rows a step."""
    tmp = tmp_path_factory.mktemp("dist")
    target = learnable_target(tmp / "target")
    # rows of 10 to 32 tokens: the ranks' micro-batches differ in anchors (as many as the row is
    # long), so their drafter forwards must be evened out (2 anchors a forward: up to 16 of them)
    lengths = torch.randint(10, 33, (48,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = [(ids[:n], mask[:n]) for (ids, mask), n in zip(greedy_text(target, 48), lengths, strict=True)]
    ds = write_dataset(tmp / "ds", rows, target)
    one = LocalContext(tmp / "c1")
    train(_params(target, ds, tmp / "r1", devices=1), one)
    return target, ds, tmp / "r1", one


def _params(
    target: Path, ds: Path, out: Path, devices: int, sharding: str = "auto", **kw: object
) -> TrainParams:
    return TrainParams(
        inputs=[str(ds)], target=str(target), out=str(out), block_size=4, anchors_per_seq=32,
        batch_size=8 // devices, lr=1e-2, checkpoint_every=4, eval_every=4, log_every=2,
        heldout_fraction=0.15, devices=devices, device="cpu", sharding=sharding, **{"max_steps": STEPS, **kw},
    )  # fmt: skip


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / f"checkpoints/step-{STEPS:08d}/model.safetensors"))


def _same_run(one: LocalContext, other: LocalContext, ref: Path, run: Path, steps: list[int]) -> None:
    a = dict(one.series("train/loss"))
    b = dict(other.series("train/loss"))
    assert sorted(b) == steps
    for step in steps:
        assert b[step] == pytest.approx(a[step], rel=1e-3), step
    for name in ("train/pos/1/total", "train/pos/3/correct", "heldout/walked/steps", "heldout/anchor/blocks"):
        assert [p for p in other.series(name) if p[0] in steps] == [
            p for p in one.series(name) if p[0] in steps
        ]
    mine, theirs = _weights(ref), _weights(run)
    assert mine.keys() == theirs.keys()
    for key in mine:  # the same parameters after 8 AdamW steps, up to float summation order
        torch.testing.assert_close(theirs[key], mine[key], rtol=1e-3, atol=1e-4, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize(("sharding", "devices"), [("fsdp", 2)])  # ddp: the resume test; 4: benchmark
def test_ranks_equal_one_rank(world: World, tmp_path: Path, sharding: str, devices: int) -> None:
    target, ds, ref, one = world
    ctx = LocalContext(tmp_path / "c")
    record = train(_params(target, ds, tmp_path / "r", devices, sharding, anchors_per_forward=2), ctx)
    assert record.world_size == devices and record.global_batch == 8
    assert record.sharding["strategy"] == sharding
    # the target's layers sharded too: its forwards (training, pre-flight generation, held-out
    # passes) in lock-step, and the same figures as one rank's
    assert record.sharding["target"] == "decoder layers sharded; embedding and head split by vocabulary"
    _same_run(one, ctx, ref, tmp_path / "r", [2, 4, 6, 8])  # counts reduced as counts: exact


class CancelAt(LocalContext):
    """Cancels the run once `at` steps are done (the checkpoint of step 4 stays the last)."""

    at = 5

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        if done == self.at:
            self.cancel()
        super().progress(done, total, unit)


@pytest.mark.slow
@pytest.mark.parametrize(("first", "then"), [((2, "fsdp"), (1, "auto")), ((1, "auto"), (2, "ddp"))])
def test_resume_on_another_number_of_ranks_continues_exactly(
    world: World,
    tmp_path: Path,
    first: tuple[int, str],
    then: tuple[int, str],
) -> None:
    target, ds, ref, one = world
    with pytest.raises(Cancelled):
        train(_params(target, ds, tmp_path / "r", *first), CancelAt(tmp_path / "c0"))
    ctx = LocalContext(tmp_path / "c")
    record = train(_params(target, ds, tmp_path / "r", *then), ctx)
    assert record.steps_done == STEPS and record.world_size == then[0]
    assert any("resumed from step 4" in e[1] for e in ctx.events)
    _same_run(one, ctx, ref, tmp_path / "r", [6, 8])


@pytest.mark.slow
def test_cancelling_stops_every_rank_together(world: World, tmp_path: Path) -> None:
    target, ds, _, _ = world
    ctx = CancelAt(tmp_path / "c")
    ctx.at = 2
    with pytest.raises(Cancelled):
        train(_params(target, ds, tmp_path / "r", 2, "fsdp", max_steps=50), ctx)
    assert max(s for s, _ in ctx.series("train/loss")) <= 4  # every rank stopped together, soon


def test_sharding_needs_ranks_and_ranks_need_sharding(world: World, tmp_path: Path) -> None:
    from draftdeck.drafter.train.sharding import choose_sharding
    from draftdeck.errors import UsageError

    assert choose_sharding("auto", 1)[0] == "none"
    assert choose_sharding("auto", 2, ddp_fits=True)[0] == "ddp"
    assert choose_sharding("auto", 2, ddp_fits=False)[0] == "fsdp"
    with pytest.raises(UsageError, match="more than one rank"):
        choose_sharding("fsdp", 1)
    with pytest.raises(UsageError, match="use ddp or fsdp"):
        choose_sharding("none", 4)


def test_launcher_environment_is_read_as_torchrun_and_srun_write_it() -> None:
    from draftdeck.drafter.train.launched import Launched
    from draftdeck.errors import DraftDeckError

    assert Launched.from_env({}) is None
    assert Launched.from_env({"RANK": "0", "WORLD_SIZE": "1"}) is None  # a world of one: train alone
    torchrun = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert Launched.from_env(torchrun) == Launched(5, 8, 1, 4)
    srun = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3", "SLURM_NTASKS_PER_NODE": "4(x2)"}
    with pytest.raises(DraftDeckError, match="MASTER_ADDR"):
        Launched.from_env(srun)
    assert Launched.from_env({**srun, "MASTER_ADDR": "node1"}) == Launched(3, 8, 3, 4)
