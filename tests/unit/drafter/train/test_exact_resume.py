"""Exact resume: an 8-step run killed (-9) after its step-4 checkpoint and launched again ends with
weights and optimizer state bit-identical to an uninterrupted run, with AdamW and with Muon, on one
rank and on 2 fsdp ranks (gloo, CPU). Every run is a real process (two under fsdp, started as torchrun
starts them), and the killed one is killed for real, every rank at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from draftdeck.drafter.train.checkpoint import load_training_state
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.errors import UsageError
from draftdeck.jobs.context import LocalContext
from tests.conftest import REPO_ROOT
from tests.support.drafter import greedy_text, learnable_target, write_dataset

STEPS = 8

# One rank of a run, as a launcher starts it; `stall`: rank 0 reports that step done, marks the file
# and waits there to be killed: the checkpoint of step 4 is on disk, the optimizer has stepped past it.
RANK = """
import sys, time, torch
from pathlib import Path
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.run import train
from draftdeck.jobs.context import LocalContext

stall, marker = int(sys.argv[3]), Path(sys.argv[4])

class Stalls(LocalContext):
    def progress(self, done, total=None, unit="rows"):
        super().progress(done, total, unit)
        if done == stall:
            marker.touch()
            time.sleep(600)

torch.set_num_threads(1)
train(TrainParams.model_validate_json(sys.argv[1]), Stalls(Path(sys.argv[2])))
"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("resume")
    target = learnable_target(root / "target")
    return target, write_dataset(root / "ds", greedy_text(target, 40), target)


def _params(prepared: tuple[Path, Path], out: Path, optimizer: str, devices: int) -> TrainParams:
    target, ds = prepared
    return TrainParams(
        inputs=[str(ds)], target=str(target), out=str(out), optimizer=optimizer, block_size=4, layers=1,
        anchors_per_seq=8, batch_size=8 // devices, lr=1e-2, max_steps=STEPS, checkpoint_every=4,
        eval_every=4, log_every=2, heldout_fraction=0.15, truth_rows=4, truth_max_new_tokens=8,
        devices=devices, sharding="fsdp" if devices > 1 else "auto", device="cpu",
    )  # fmt: skip


def _launch(params: TrainParams, ctx: Path, stall: int = 0) -> list[subprocess.Popen[bytes]]:
    """The run's ranks, each a process of its own session (so that a kill takes it whole)."""
    world = params.devices
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    if world > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world))
        env.update(LOCAL_WORLD_SIZE=str(world))
    procs = []
    for rank in range(world):
        if world > 1:
            env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        args = [params.model_dump_json(), str(ctx), str(stall), str(ctx / "stalled")]
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, *args], env=env, start_new_session=True))
    return procs


def _finish(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        assert proc.wait(timeout=300) == 0


def _same(a: Any, b: Any, where: str) -> None:
    """`a` and `b` equal to the bit: every tensor by torch.equal, everything else by ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.slow
@pytest.mark.parametrize(("optimizer", "devices"), [("adamw", 1), ("muon", 1), ("muon", 2)])
def test_a_run_killed_after_its_step_4_checkpoint_resumes_bit_identical(
    prepared: tuple[Path, Path], tmp_path: Path, optimizer: str, devices: int
) -> None:
    killed = _params(prepared, tmp_path / "killed", optimizer, devices)
    procs = _launch(killed, tmp_path / "c-killed", stall=5)
    marker, deadline = tmp_path / "c-killed/stalled", time.monotonic() + 300
    while not marker.exists() and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a rank ended before it could be killed"
        time.sleep(0.05)
    assert marker.exists(), "the run never reached step 5"
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    steps = sorted(p.name for p in (tmp_path / "killed/checkpoints").glob("step-*"))
    assert steps == ["step-00000004"]  # killed after step 5's update: the checkpoint of step 4 is the last

    _finish(_launch(killed, tmp_path / "c-resumed"))  # launched again, the same run folder
    _finish(_launch(_params(prepared, tmp_path / "whole", optimizer, devices), tmp_path / "c-whole"))

    last = f"checkpoints/step-{STEPS:08d}"
    resumed_weights = load_file(str(tmp_path / "killed" / last / "model.safetensors"))
    whole_weights = load_file(str(tmp_path / "whole" / last / "model.safetensors"))
    _same(resumed_weights, whole_weights, "weights")
    resumed = load_training_state(tmp_path / "killed" / last / "training.pt")
    whole = load_training_state(tmp_path / "whole" / last / "training.pt")
    assert resumed["optimizer"]["state"]  # the optimizer's state is there to compare
    if optimizer == "muon":  # Muon's one momentum buffer for the hidden layers' matrices, AdamW's two moments
        kinds = {tuple(sorted(s)) for s in resumed["optimizer"]["state"].values()}
        assert kinds == {("momentum_buffer",), ("exp_avg", "exp_avg_sq", "step")}
    _same(resumed["optimizer"], whole["optimizer"], "optimizer")
    _same(resumed["scheduler"], whole["scheduler"], "scheduler")
    record = json.loads((tmp_path / "killed/run.json").read_text())
    assert record["lr_schedule"]["optimizer"] == optimizer and record["steps_done"] == STEPS
    if optimizer == "adamw":  # the other optimizer's state cannot continue this one's: refused by name
        other = _params(prepared, tmp_path / "killed", "muon", devices).model_copy(update={"max_steps": 12})
        with pytest.raises(UsageError, match="trained with optimizer adamw, now muon"):
            train(other, LocalContext(tmp_path / "c-other"))
        # nor another objective: run.json would name one loss for steps trained with two
        for change in ({"position_weights": "dpace"}, {"loss": "kl"}):
            other = killed.model_copy(update={"max_steps": 12, **change})
            with pytest.raises(UsageError, match=r"trained with loss .*, now .*--position-weights"):
                train(other, LocalContext(tmp_path / "c-objective"))
