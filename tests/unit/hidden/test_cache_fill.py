"""`train --hidden-states-cache CACHE` with no cache yet: the first epoch trains online and fills it, the
second reads it, and every loss and count is the online run's (fp32, CPU); the cache holds what
cache-hidden builds; a start cancelled mid-epoch leaves only its spill, never a cache, and its resume
fills the cache anew and trains on as the online run does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from draftdeck.drafter.train.cache.fill import SPILL
from draftdeck.errors import Cancelled
from draftdeck.hidden.store import MANIFEST, HiddenCache
from draftdeck.jobs.context import LocalContext
from tests.unit.hidden.conftest import TIMED

STEPS = 8  # the tiny world's training split is 5 steps of 4 rows: the run crosses into its second epoch


class StopAt(LocalContext):
    """A job cancelled as it reports step `stop` (after that step, before its checkpoint)."""

    stop = 0

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        if done == self.stop:
            self.cancel()
        super().progress(done, total, unit)


def _run(
    world: dict[str, Path], name: str, ctx: LocalContext | None = None, drafter: str = "dflash", **given: Any
) -> tuple[list, LocalContext]:
    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.run import run_train

    kind: dict[str, object] = (
        {"ttt_steps": 2, "draft_vocab_size": 20} if drafter == "eagle3" else {"block_size": 4}
    )
    params = TrainParams(
        inputs=[str(world["ds"])], target=str(world["target"]), out=str(world["root"] / name),
        drafter=drafter, batch_size=4, max_steps=STEPS, eval_every=3, checkpoint_every=3,
        log_every=1, heldout_fraction=0.15, device="cpu", **kind, **given,
    )  # fmt: skip
    ctx = ctx or LocalContext(world["root"] / f"{name}-ctx")
    run_train(params, ctx)
    return sorted((p.step, p.name, p.value) for p in ctx.points if p.name not in TIMED), ctx


def _said(ctx: LocalContext, text: str) -> list[str]:
    return [m for _, m, _, _ in ctx.events if text in m]


@pytest.mark.parametrize("drafter", ["dflash", "eagle3"])
def test_the_first_epoch_fills_the_cache_and_the_second_reads_it(
    world: dict[str, Path], cache: Path, drafter: str
) -> None:
    folder = world["root"] / f"filled-{drafter}"
    online, _ = _run(world, f"fill-online-{drafter}", drafter=drafter, truth_rows=0)
    hybrid, ctx = _run(world, f"fill-hybrid-{drafter}", drafter=drafter, hidden_states_cache=str(folder))
    assert any(name == "train/loss" and step > 5 for step, name, _ in online)
    assert hybrid == online  # every loss and count, the second epoch's from the cache
    [said] = _said(ctx, "filled during the first epoch")
    assert "24 rows" in said and "the later epochs and every later start read it" in said
    assert not folder.with_name(folder.name + SPILL).exists()
    assert ctx.last_progress == (STEPS, STEPS, "steps")  # the job's progress stays in steps
    assert (folder / MANIFEST).is_file()
    # what cache-hidden builds (its drafters' layers are a superset of this run's), row for row
    filled, built = HiddenCache(folder), HiddenCache(cache)
    assert filled.mf.rows == 24 and set(filled.mf.layers) <= set(built.mf.layers)
    slots = [built.mf.layers.index(j) for j in filled.mf.layers]
    for key, e in built.by_row.items():
        f = filled.by_row[key]
        assert torch.equal(filled.ids(f), built.ids(e))
        torch.testing.assert_close(filled.hidden(f), built.hidden(e)[:, slots], rtol=1e-5, atol=1e-5)


def test_a_start_cancelled_in_its_first_epoch_leaves_no_cache_and_its_resume_fills_it(
    world: dict[str, Path],
) -> None:
    folder = world["root"] / "resumed-cache"
    online, _ = _run(world, "resume-online", truth_rows=0)
    stop = StopAt(world["root"] / "resume-ctx-1")
    stop.stop = 4
    try:
        _run(world, "resume-hybrid", stop, hidden_states_cache=str(folder))
        raise AssertionError("the run was to be cancelled at step 4")
    except Cancelled:
        pass
    spill = folder.with_name(folder.name + SPILL)
    assert spill.is_dir() and not folder.exists()  # a half cache is never one a run may read
    again, ctx = _run(world, "resume-hybrid", hidden_states_cache=str(folder))
    assert _said(ctx, "resumed from step 3") and _said(ctx, "filled during the first epoch")
    assert again == [p for p in online if p[0] > 3]
    assert not spill.exists() and json.loads((folder / MANIFEST).read_text())["rows"] == 24
