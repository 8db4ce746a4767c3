"""`train --hidden-states-cache CACHE`: the first start fills the cache (a run that ends within its first
epoch, at its end), with the online run's losses and counts (bit-equal at fp32 on the CPU); a later
start finds it whole, builds nothing and trains from it as the online run does; a launcher's rank does not
build one. (The fill across an epoch's end: test_cache_fill.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from draftdeck.drafter.train.cache.first import cache_first
from draftdeck.drafter.train.params import TrainParams
from draftdeck.errors import UsageError
from draftdeck.hidden.store import MANIFEST, read_manifest
from draftdeck.jobs.context import LocalContext
from tests.unit.hidden.conftest import train_run


def _said(ctx: LocalContext, text: str) -> list[str]:
    return [m for level, m, _, _ in ctx.events if level == "info" and text in m]


def test_the_first_start_builds_the_cache_and_a_later_one_reads_it(world: dict[str, Path]) -> None:
    folder = world["root"] / "own-cache"
    online, _, _ = train_run(world, "first-online", "dflash", truth_rows=0)
    first, run, ctx = train_run(world, "first-cached", "dflash", hidden_states_cache=str(folder))
    assert len(_said(ctx, "filled during the first epoch")) == 1 and not _said(ctx, "found whole")
    mf = read_manifest(folder)
    assert mf.dtype == "fp32" and mf.layers[-1] == mf.num_layers  # a CPU run's own precision
    assert any(name == "train/loss" for _, name, _ in online)
    assert first == online  # every loss and count (and no build metric among the steps' points)
    assert run["steps_done"] == 3

    built = (folder / MANIFEST).stat().st_mtime_ns
    again, _, ctx = train_run(world, "second-cached", "dflash", hidden_states_cache=str(folder))
    assert len(_said(ctx, "found whole")) == 1 and not _said(ctx, "filled during")
    assert (folder / MANIFEST).stat().st_mtime_ns == built  # nothing built again
    assert again == online


def test_a_cache_to_make_is_asked_for_alone_and_not_by_a_launchers_rank(
    world: dict[str, Path], cache: Path
) -> None:
    base = {"inputs": [str(world["ds"])], "target": str(world["target"]), "out": str(world["root"] / "r")}
    own = TrainParams.model_validate({**base, "hidden_states_cache": str(world["root"] / "nowhere")})
    assert own.truth_rows == 0  # as from any cache
    with pytest.raises(ValueError, match="hidden_states, hidden_states_cache: give one"):
        TrainParams.model_validate({**base, "hidden_states_cache": "a", "hidden_states": "b"})
    with pytest.raises(ValueError, match=r"hidden_states_cache: .*truth_rows 8: set 0"):
        TrainParams.model_validate({**base, "hidden_states_cache": "a", "truth_rows": 8})
    ctx = LocalContext(world["root"] / "launched-ctx")
    with pytest.raises(UsageError, match="the ranks of a launcher's run do not build one"):
        cache_first(own, ctx, launched=True)
    assert not (world["root"] / "nowhere").exists()
    folder = world["root"] / "cache-fp32-own"
    shutil.copytree(cache, folder)
    reading = cache_first(own.model_copy(update={"hidden_states_cache": str(folder)}), ctx, launched=True)
    # what the ranks a run starts validate again: a cache to read, alone
    again = TrainParams.model_validate(reading.model_dump())
    assert (again.hidden_states, again.hidden_states_cache) == (str(folder), None)
