"""The trainer on a tiny learnable target (CPU): learning, cancel, NaN, a failing checkpoint write,
kill -9 then resume, and the checks that refuse bad inputs before any step."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from draftdeck.drafter.train import trainer as trainer_mod
from draftdeck.drafter.train.checkpoint import CheckpointWriteError, load_training_state
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import run_train, train
from draftdeck.drafter.train.trainer import TrainingDiverged
from draftdeck.errors import Cancelled, InputError, UsageError
from draftdeck.jobs.context import LocalContext
from tests.conftest import REPO_ROOT
from tests.support.drafter import greedy_text, learnable_target, write_dataset
from tests.support.planted import plant_torch
from tests.support.provenance import assert_provenance

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("drafter")
    target = learnable_target(root / "target")
    return target, write_dataset(root / "ds", greedy_text(target, 64), target)


def _params(prepared: tuple[Path, Path], out: Path, **kw: Any) -> TrainParams:
    target, ds = prepared
    values: dict[str, Any] = dict(
        inputs=[str(ds)],
        target=str(target),
        out=str(out),
        block_size=4,
        layers=1,
        anchors_per_seq=8,
        batch_size=8,
        lr=1e-2,
        max_steps=60,
        checkpoint_every=20,
        eval_every=20,
        log_every=10,
        heldout_fraction=0.15,
        device="cpu",
    )
    values.update(kw)
    return TrainParams(**values)


def _tau(ctx: LocalContext) -> list[float]:
    acc, steps = ctx.series("heldout/walked/accepted"), ctx.series("heldout/walked/steps")
    return [1 + a / s for (_, a), (_, s) in zip(acc, steps, strict=True)]


def test_loss_falls_and_walked_tau_rises_above_two(prepared: tuple[Path, Path], tmp_path: Path) -> None:
    ctx = LocalContext(tmp_path / "ctx")
    report = run_train(_params(prepared, tmp_path / "run"), ctx)
    loss = [v for _, v in ctx.series("train/loss")]
    assert loss[-1] < loss[0] / 5, loss
    tau = _tau(ctx)
    assert tau[-1] > 2.0 and tau[-1] > tau[0], tau
    assert ctx.total("train/pos/1/total") == 60 * 8 * 8  # every anchor's slot 1 is a label here
    assert [s for s, _ in ctx.series("train/loss")] == [10, 20, 30, 40, 50, 60]
    assert all(ctx.series(f"heldout/hist/{n}") for n in range(1, 5))
    index = json.loads((tmp_path / "run/checkpoints/index.json").read_text())
    assert [c["step"] for c in index["checkpoints"]] == [20, 40, 60]
    best = max(index["checkpoints"], key=lambda c: c["heldout_walked_accepted"] / c["heldout_walked_steps"])
    assert index["best"] == best["step"]
    run = json.loads((tmp_path / "run/run.json").read_text())
    assert run["drafter"]["block_size"] == 4 and run["drafter"]["target_layer_ids"] == [0, 1]
    assert run["drafter"]["mask_token_source"] == "unused_embedding_row"
    assert "drafter: DFlash, 1 layer, blocks of 4" in [m for _, m, _, _ in ctx.events]
    assert run["world_size"] == 1 and run["steps_done"] == 60 and len(run["manifest_sha256"]) == 1
    assert_provenance(run["provenance"])  # what decided these numbers: versions, commit, device
    assert run["provenance"]["parameters"]["block_size"] == 4 and run["provenance"]["command"] is None
    assert report.rows_in == 64 == report.rows_out and report.extra["heldout_rows"] > 0
    assert report.outputs[0].path.endswith("step-00000060/model.safetensors")
    # weights and run.json hold no rows: pages show them without a row count
    assert [(o.kind, o.rows) for o in report.outputs] == [("artifact", 0), ("artifact", 0)]
    report.check_accounting()
    mask_id = run["drafter"]["mask_token_id"]
    assert json.loads((tmp_path / "run/checkpoints/step-00000060/config.json").read_text())[
        "dflash_config"
    ] == {
        "block_size": 4,
        "target_layer_ids": [0, 1],
        "mask_token_id": mask_id,
        "num_target_layers": 2,
        "mask_token": "<|MASK|>",  # the first unused row: SGLang adds this text and gets mask_id
    }


@pytest.mark.parametrize("loss", ["kl", "ce+kl"])
def test_a_kl_run_learns_the_target_and_counts_expected_acceptance(
    prepared: tuple[Path, Path], tmp_path: Path, loss: str
) -> None:
    """The data are the target's greedy answers: learning its distribution raises tau as the CE does,
    and every held-out pass counts the expected acceptance per slot, a probability per slot."""
    ctx = LocalContext(tmp_path / "ctx")
    run_train(_params(prepared, tmp_path / "run", loss=loss, kl_weight=2.0), ctx)
    values = [v for _, v in ctx.series("train/loss")]
    assert values[-1] < values[0] / 3, values
    tau = _tau(ctx)
    assert tau[-1] > 2.0 and tau[-1] > tau[0], tau
    for k in range(1, 4):
        sums = [v for _, v in ctx.series(f"heldout/pos/{k}/accept_sum")]
        totals = [v for _, v in ctx.series(f"heldout/pos/{k}/accept_total")]
        assert len(sums) == 3 and all(0 < s <= t for s, t in zip(sums, totals, strict=True))
    first, last = (ctx.series("heldout/pos/1/accept_sum")[i][1] for i in (0, -1))
    assert last > first  # the drafter's distribution moved toward the target's
    assert ctx.series("train/pos/1/accept_total")  # the KL run measures it while training too
    said = json.loads((tmp_path / "run/run.json").read_text())["loss"]
    assert ("2 KL(p_target || q_draft)_k" in said) and (("CE_k + " in said) == (loss == "ce+kl"))


class CancelAt(LocalContext):
    def __init__(self, out_dir: Path, at: int):
        super().__init__(out_dir)
        self.at = at

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        if done == self.at:
            self.cancel()
        super().progress(done, total, unit)


def test_cancel_stops_within_one_step_and_keeps_the_last_checkpoint(prepared, tmp_path: Path) -> None:
    ctx = CancelAt(tmp_path / "ctx", at=3)
    with pytest.raises(Cancelled):
        train(_params(prepared, tmp_path / "run", checkpoint_every=2, log_every=1), ctx)
    assert max(s for s, _ in ctx.series("train/loss")) <= 3
    index = json.loads((tmp_path / "run/checkpoints/index.json").read_text())
    assert [c["step"] for c in index["checkpoints"]] == [2]
    # the folder holds this run: another seed there is refused before any step, naming what differs
    with pytest.raises(UsageError, match=r"holds a run with another seed .*use a new out folder"):
        train(
            _params(prepared, tmp_path / "run", checkpoint_every=2, log_every=1, seed=7),
            LocalContext(tmp_path / "c2"),
        )


def test_nan_loss_stops_with_an_alert_naming_the_step(prepared, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    target, _ = prepared
    train(_params(prepared, tmp_path / "run", max_steps=4, checkpoint_every=2), LocalContext(tmp_path / "c1"))
    bad = tmp_path / "nan_target"
    shutil.copytree(target, bad)
    model = AutoModelForCausalLM.from_pretrained(bad)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.fill_(float("nan"))
    model.save_pretrained(bad)
    run = tmp_path / "run"
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    index = json.loads((run / "checkpoints/index.json").read_text())
    index["checkpoints"] = [c for c in index["checkpoints"] if c["step"] == 2]
    index["best"] = 2
    (run / "checkpoints/index.json").write_text(json.dumps(index))
    ctx = LocalContext(tmp_path / "c2")
    with pytest.raises(TrainingDiverged, match="at step 3"):
        train(_params(prepared, run, max_steps=4, checkpoint_every=2, target=str(bad)), ctx)
    assert ctx.alerts and ctx.alerts[0][0] == "training_diverged" and "step 3" in ctx.alerts[0][1]
    after = json.loads((run / "checkpoints/index.json").read_text())
    assert [c["step"] for c in after["checkpoints"]] == [2]


def test_a_checkpoint_write_failing_midway_leaves_the_previous_one_intact(
    prepared, tmp_path, monkeypatch
) -> None:
    from safetensors.torch import load_file

    run = tmp_path / "run"
    train(_params(prepared, run, max_steps=2, checkpoint_every=2), LocalContext(tmp_path / "c1"))
    before = (run / "checkpoints/index.json").read_text()
    weights = load_file(str(run / "checkpoints/step-00000002/model.safetensors"))

    def full_disk(obj: Any) -> Any:
        def write(f: Any) -> None:
            f.write(b"partial")
            raise OSError(28, "No space left on device")

        return write

    monkeypatch.setattr(trainer_mod, "torch_writer", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"No space left on device.*previous checkpoint is intact"):
        train(_params(prepared, run, max_steps=4, checkpoint_every=2), LocalContext(tmp_path / "c2"))
    assert (run / "checkpoints/index.json").read_text() == before
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["index.json", "step-00000002"]
    again = load_file(str(run / "checkpoints/step-00000002/model.safetensors"))
    assert all(torch.equal(weights[k], again[k]) for k in weights)


KILLED_RUN = """
import sys, time, torch
torch.set_num_threads(1)
from pathlib import Path
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.jobs.context import LocalContext

class Slow(LocalContext):
    def progress(self, done, total=None, unit="rows"):
        time.sleep(0.15)  # keep the run alive long enough to be killed mid-way
        super().progress(done, total, unit)

train(TrainParams.model_validate_json(sys.argv[1]), Slow(Path(sys.argv[2])))
"""


@pytest.mark.slow
def test_kill_9_then_resume_continues_steps_and_matches_an_uninterrupted_run(
    prepared, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    kw: dict[str, Any] = dict(max_steps=40, checkpoint_every=5, eval_every=40, log_every=1)
    killed = _params(prepared, tmp_path / "killed", **kw)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, killed.model_dump_json(), str(tmp_path / "kctx")], env=env
    )
    index = tmp_path / "killed/checkpoints/index.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if index.is_file() and json.loads(index.read_text())["checkpoints"][-1]["step"] >= 10:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    last = max(c["step"] for c in json.loads(index.read_text())["checkpoints"])
    assert 10 <= last < 40
    resumed = LocalContext(tmp_path / "rctx")
    train(killed, resumed)
    steps = [s for s, _ in resumed.series("train/loss")]
    assert steps == list(range(last + 1, 41))  # continuous numbering from the checkpoint
    whole = LocalContext(tmp_path / "wctx")
    train(_params(prepared, tmp_path / "whole", **kw), whole)
    want = dict(whole.series("train/loss"))
    for s, v in resumed.series("train/loss"):
        assert v == pytest.approx(want[s], rel=1e-5, abs=1e-6)  # same rows, same anchors, same order
    a = load_file(str(tmp_path / "killed/checkpoints/step-00000040/model.safetensors"))
    b = load_file(str(tmp_path / "whole/checkpoints/step-00000040/model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    whole_walked = dict(whole.series("heldout/walked/accepted"))
    assert resumed.series("heldout/walked/accepted")
    assert all(whole_walked[s] == v for s, v in resumed.series("heldout/walked/accepted"))


def test_a_planted_training_state_runs_nothing_and_the_resume_is_refused_by_name(
    prepared, tmp_path: Path
) -> None:
    """A run folder travels (a shared disk, a download): its training.pt made to call a function on load
    is refused when the run resumes, naming the file and what it asked for; the call is never made."""
    kw: dict[str, Any] = dict(max_steps=2, checkpoint_every=2, eval_every=2, log_every=1)
    train(_params(prepared, tmp_path / "run", **kw), LocalContext(tmp_path / "c1"))
    state = tmp_path / "run/checkpoints/step-00000002/training.pt"
    assert {"optimizer", "scheduler", "rng"} <= load_training_state(state).keys()  # the real one reads
    marker = tmp_path / "ran"
    plant_torch(state, marker, optimizer={}, scheduler={}, rng={})
    with pytest.raises(InputError, match=r"step-00000002/training\.pt: refused: it asks to run code"):
        train(_params(prepared, tmp_path / "run", **{**kw, "max_steps": 4}), LocalContext(tmp_path / "c2"))
    assert not marker.exists()


def test_each_epoch_visits_every_row_at_most_once_and_resumes_mid_epoch(prepared, tmp_path: Path) -> None:
    from draftdeck.drafter.train.data import DataPosition
    from draftdeck.drafter.train.trainer import Trainer

    tr = Trainer(_params(prepared, tmp_path / "run", batch_size=5), LocalContext(tmp_path / "ctx"))
    n = len(tr.data.train)
    seen: dict[int, list[int]] = {}
    for _ in range(3 * (n // 5)):
        for epoch, index in tr._next_rows():
            seen.setdefault(epoch, []).append(int(tr.data.epoch_order(0, epoch)[index]))
    assert sorted(seen) == [0, 1, 2]
    for rows in seen.values():
        assert len(rows) == len(set(rows)) == (n // 5) * 5
    tr.pos = DataPosition(1, 10)  # what a checkpoint restores
    assert tr._next_rows()[0] == (1, 10)
