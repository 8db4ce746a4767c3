"""The tiny world the cache tests share: a learnable 2-layer target, a dataset of its own text and its
fp32 cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.drafter import greedy_text, learnable_target, write_dataset


@pytest.fixture(scope="package")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hidden")
    target = learnable_target(root / "target")
    ds = write_dataset(root / "ds", greedy_text(target, 24), target)
    return {"root": root, "target": target, "ds": ds}


@pytest.fixture(scope="package")
def cache(world: dict[str, Path]) -> Path:
    from draftdeck.drafter.cache.build import run_cache_hidden
    from draftdeck.drafter.cache.params import CacheParams
    from draftdeck.jobs.context import LocalContext

    out = world["root"] / "cache-fp32"
    params = CacheParams(inputs=[str(world["ds"])], target=str(world["target"]), out=str(out), dtype="fp32")
    run_cache_hidden(params, LocalContext(world["root"] / "cache-ctx"))
    return out
