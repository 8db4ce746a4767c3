"""`train --hidden-states-cache CACHE`: a run that makes its own cache, over the run's datasets and for
the layers its drafter reads. A start that finds CACHE whole trains from it as `--hidden-states CACHE`
does (a resume, a second kind on the same data: no target forward). When it is not there yet, a run in
one process fills it during its first epoch (fill.py: the epoch trains online and keeps the states its
forwards compute; the cache is written when the epoch ends and read from the second on); a run that
starts its own ranks (`--devices N`) has it built first, before the ranks start, with the `cache-hidden`
job's own code.

A cache folder exists only whole (`CacheWriter` renames it when done), so a start that finds it trains
from it; a build that died left `<CACHE>.partial`, and a fill that died `<CACHE>.filling`, which the
next build or fill replaces and nothing reads."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from draftdeck.errors import UsageError
from draftdeck.hidden.store import MANIFEST
from draftdeck.jobs.context import RunContext
from draftdeck.quality import Report

if TYPE_CHECKING:
    from draftdeck.drafter.train.cache.params import CacheParams
    from draftdeck.drafter.train.params import TrainParams


class Building:
    """The train job's context as the build sees it: its log, progress and cancel; not its metrics,
    which are per training step (the build's throughput is said once, in the log)."""

    def __init__(self, ctx: RunContext):
        self.ctx, self.out_dir = ctx, ctx.out_dir

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        self.ctx.progress(done, total, unit)

    def check_cancelled(self) -> None:
        self.ctx.check_cancelled()

    def event(self, level: str, message: str, *, code: str | None = None, count: int = 1) -> None:
        self.ctx.event(level, message, code=code, count=count)

    def metrics(self, step: int, values: Mapping[str, float], *, tokens: int | None = None) -> None:
        return None  # rows built are not training steps

    def alert(self, kind: str, message: str) -> None:
        self.ctx.alert(kind, message)


def cache_first(params: TrainParams, ctx: RunContext, *, launched: bool) -> TrainParams:
    """`params` reading its cache (`hidden_states`) when it is whole or built first (a run of several
    ranks); `params` as given (its trainer fills the cache during the first epoch) for a run in one
    process. `launched`: one rank of a launcher's run, which neither builds nor fills (every rank would)."""
    folder = params.hidden_states_cache
    if folder is None:
        return params
    # as `--hidden-states CACHE` alone: what the ranks a run starts validate again (one of the two)
    reading = params.model_copy(update={"hidden_states": folder, "hidden_states_cache": None})
    if (Path(folder) / MANIFEST).is_file():
        ctx.event("info", f"hidden_states_cache {folder}: found whole; the run trains from it")
        return reading
    if launched:
        raise UsageError(
            f"hidden_states_cache {folder}: no cache there yet, and the ranks of a launcher's run do not"
            " build one: build it with draftdeck cache-hidden, or start the run with --devices"
        )
    if params.devices == 1:
        ctx.event(
            "info",
            f"hidden_states_cache {folder}: not there yet; the first epoch trains online and fills it, the"
            " later epochs (and every later start) read it",
        )
        return params
    report = _build(params, folder, ctx)
    x = report.extra
    ctx.event(
        "info",
        f"hidden_states_cache {folder}: built first (the cache-hidden job's code, before step 1):"
        f" {report.rows_out:,} rows, {x['tokens']:,} tokens, hidden_states {x['layers']} in {x['dtype']},"
        f" {x['cache/rows_per_s']:,.1f} rows/s; the run trains from it, and so will every later start",
    )
    return reading


def _build(params: TrainParams, folder: str, ctx: RunContext) -> Report:
    from draftdeck.drafter.train.cache.build import build_cache

    cpu = params.device == "cpu" or not _has_cuda()
    return build_cache(cache_params(params, cpu=cpu), Building(ctx), device="cpu" if cpu else "cuda")


def cache_params(params: TrainParams, *, cpu: bool) -> CacheParams:
    """The cache-hidden parameters of the cache `params.hidden_states_cache` names: the run's datasets,
    the layers its drafter reads (and the final one), cut at its seq_length; fp32 for a CPU run, bf16 on
    a GPU (the target's own precision there)."""
    from draftdeck.drafter.kinds import get_kind
    from draftdeck.drafter.train.cache.params import CacheParams
    from draftdeck.drafter.train.plan import shape_of, target_config

    assert params.hidden_states_cache is not None

    shape = shape_of(params, seq_length=params.seq_length or 4096, element_size=4, world=1)
    config = target_config(params.target)
    # the layers this run's drafter reads (its options: target_layer_ids, eagle3_layer_ids ...); -1, the
    # embeddings, is among the kind's own (CacheParams' drafter), which the cache stores too
    ids = [int(i) for i in get_kind(params.drafter).plan(shape, config).cfg.target_layer_ids]
    return CacheParams(
        inputs=params.inputs, target=params.target, out=params.hidden_states_cache, drafter=[params.drafter],
        layers=params.layers, layer_ids=[i for i in ids if i >= 0] or None, dtype="fp32" if cpu else "bf16",
        seq_length=params.seq_length,
    )  # fmt: skip


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())
