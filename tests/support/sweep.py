"""A real sweep on the tiny world, for the sweep's tests and its page's: block size 2 and 4 x greedy and
sampled decoding of a briefly trained DFlash drafter, 3 prompts of 12 new tokens (a few seconds)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftdeck.jobs.context import LocalContext
from tests.support.eval import TinyWorld, build_world, trained_checkpoint

MAX_NEW = 12
GRID = ["block_size=2,4", "mode=greedy,sampled"]


@dataclass
class RealSweep:
    world: TinyWorld
    checkpoint: Path
    params: dict[str, Any]  # the job's parameters, as stored
    result: dict[str, Any]  # what sweep.json holds: the job's report, as the job stores it
    report: dict[str, Any]  # the report the run returned
    ctx: LocalContext  # what it ran with: its events and progress
    out: Path


def real_sweep(root: Path) -> RealSweep:
    from draftdeck.drafter.eval.sweep import run_sweep
    from draftdeck.drafter.eval.sweep_params import SweepParams

    world = build_world(root / "world", n_prompts=3)
    checkpoint = trained_checkpoint(world, root / "drafter", max_new=MAX_NEW, steps=20)
    params = SweepParams.model_validate({
        "inputs": [str(checkpoint)], "target": str(world.target_dir), "prompts": [str(world.prompts)],
        "max_new_tokens": MAX_NEW, "grid": GRID, "out": str(root / "sweep"),
    })  # fmt: skip
    ctx = LocalContext(root / "job")
    report = run_sweep(params, ctx)
    stored = json.loads((root / "sweep" / "sweep.json").read_text(encoding="utf-8"))
    return RealSweep(
        world, checkpoint, params.model_dump(mode="json"), stored, report.to_dict(), ctx, root / "sweep"
    )
