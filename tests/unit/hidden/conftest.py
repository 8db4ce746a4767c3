"""The tiny world the cache tests share: a learnable 2-layer target, a dataset of its own text and its
fp32 cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    from draftdeck.drafter.train.cache.job import run_cache_hidden
    from draftdeck.drafter.train.cache.params import CacheParams
    from draftdeck.jobs.context import LocalContext

    out = world["root"] / "cache-fp32"
    params = CacheParams(inputs=[str(world["ds"])], target=str(world["target"]), out=str(out), dtype="fp32")
    run_cache_hidden(params, LocalContext(world["root"] / "cache-ctx"))
    return out


# what wall time and memory make differ between two equal runs
TIMED = ("train/tokens_per_s", "train/step_seconds", "train/peak_memory_mib", "heldout/seconds",
         "heldout/peak_memory_mib")  # fmt: skip


def train_run(world: dict[str, Path], name: str, drafter: str, **given: object) -> tuple[list, dict, Any]:
    """A 3-step run on the tiny world at fp32 on the CPU: its metric points (wall time aside), its
    run.json and its context (the log)."""
    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.run import run_train
    from draftdeck.jobs.context import LocalContext

    kind: dict[str, object] = (
        {"ttt_steps": 2, "draft_vocab_size": 20} if drafter == "eagle3" else {"block_size": 4}
    )
    params = TrainParams(
        inputs=[str(world["ds"])], target=str(world["target"]), out=str(world["root"] / name),
        drafter=drafter, batch_size=4, max_steps=3, eval_every=3, checkpoint_every=3, log_every=1,
        heldout_fraction=0.15, device="cpu", **kind, **given,
    )  # fmt: skip
    ctx = LocalContext(world["root"] / f"{name}-ctx")
    run_train(params, ctx)
    points = sorted((p.step, p.name, p.value) for p in ctx.points if p.name not in TIMED)
    return points, json.loads((world["root"] / name / "run.json").read_text()), ctx


def vllm_files(world: dict[str, Path], folder: Path, order: list[int]) -> None:
    """hs_<i>.safetensors as vLLM's hidden-state connector writes them: from the target's own forward of
    each dataset row, the HF `hidden_states` indices `order` in that order, and the row's ids."""
    from safetensors.torch import save_file

    from draftdeck.drafter.model.target import Target
    from draftdeck.drafter.train.cache.build import dataset_rows

    folder.mkdir(parents=True)
    target = Target.load(world["target"], with_tokenizer=False)
    for i, (_, _, ids) in enumerate(dataset_rows([world["ds"]], None)):
        with torch.no_grad():
            hs = target.model(input_ids=torch.from_numpy(ids)[None], output_hidden_states=True).hidden_states
        save_file({"hidden_states": torch.stack([hs[j][0] for j in order], 1).contiguous(),
                   "token_ids": torch.from_numpy(ids)}, str(folder / f"hs_{i}.safetensors"))  # fmt: skip
