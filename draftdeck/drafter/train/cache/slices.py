"""A cache built in slices of rows and merged into one: how the service's chunk tasks (one slice a task,
app/run/hidden_chunks.py) and a launcher's ranks (one slice a rank, `build_ranked`) share a build.

Each slice is a cache of its own (build.py's `build_cache` over the rows whose index over all datasets'
rows is in the slice): its own shards, its own manifest, every row checked and read back, the first
rows of the whole cache compared with a live forward by the slice that holds them. `merge_slices` then
takes the slices' folders in row order into the one cache: their manifests must agree on what they hold
(the target, the datasets, the layers, the dtype, the cut), together cover every row the slices stored
exactly once, and each shard keeps the sha256 its slice's manifest names (checked as it is moved, under
`<out>.partial`, renamed when whole: the cache exists only complete). Rows are each their own forward's
(build.py), so the merged cache holds what one process would have built, row for row; only where the
shards are cut differs."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.drafter.train.launched import leave_process_group
from draftdeck.errors import JobFailed, UsageError
from draftdeck.fileio import sha256_file
from draftdeck.hidden.store import MANIFEST, CacheError, CacheManifest, read_manifest
from draftdeck.jobs.context import RunContext
from draftdeck.quality import Policy, Report

# what every slice of one cache holds alike
SAME = ("target_fingerprint", "datasets", "layers", "num_layers", "hidden_size", "dtype", "seq_length")


def slice_rows(total: int, size: int) -> list[range]:
    """Consecutive slices of at most `size` rows covering rows 0..total."""
    return [range(start, min(start + size, total)) for start in range(0, total, max(1, size))]


def rank_rows(total: int, rank: int, world: int) -> range:
    """Rank `rank`'s share of `total` rows: consecutive, the first `total % world` ranks one row more."""
    per, extra = divmod(total, world)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (1 if rank < extra else 0))


def build_slice(
    params: CacheParams, rows: range, folder: Path, ctx: RunContext, *, device: str = "auto"
) -> Report:
    """The cache of `rows` alone, in `folder` (replaced: a slice run again after its worker was lost
    starts clean). Its report counts its rows; speculators' files are the merge's."""
    from draftdeck.drafter.train.cache.build import build_cache

    shutil.rmtree(folder, ignore_errors=True)
    part = params.model_copy(update={"out": str(folder), "format": "draftdeck"})
    return build_cache(part, ctx, device=device, only=rows)


def merge_slices(params: CacheParams, folders: list[Path], report: Report, *, seconds: float) -> Report:
    """The slices in `folders` (in row order) into the cache `params.out`; `report`: the slices' reports
    merged (its rows_out must be what their manifests hold). Returns it with the cache's outputs and the
    build's throughput over `seconds`."""
    from draftdeck.drafter.train.cache.build import finish, verify, write_speculators

    out, paths = Path(params.out), [Path(p) for p in params.inputs]
    manifests = [read_manifest(f) for f in folders]
    if not manifests:
        raise JobFailed("no slice of the cache was built", report)
    first = manifests[0]
    for folder, mf in zip(folders, manifests, strict=True):
        differs = [k for k in SAME if getattr(mf, k) != getattr(first, k)]
        if differs:
            raise CacheError(
                f"{folder}: its {', '.join(differs)} differ from the first slice's ({folders[0]})"
            )
    seen: set[tuple[int, int]] = set()
    for mf in manifests:
        for s in mf.shards:
            rows = {(s.dataset, s.first_row + k) for k in range(s.rows)}
            if rows & seen:
                raise CacheError(f"{s.filename}: rows of dataset {s.dataset} stored by two slices")
            seen |= rows
    if len(seen) != report.rows_out:
        raise JobFailed(
            f"the slices hold {len(seen):,} rows but their reports count {report.rows_out:,} stored", report
        )
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out}: the cache folder exists and is not empty; name a new one")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    merged: CacheManifest = replace(first, shards=[])
    try:
        for folder, mf in zip(folders, manifests, strict=True):
            for s in mf.shards:
                name = f"hidden-{len(merged.shards):05d}.safetensors"
                shutil.move(folder / s.filename, tmp / name)
                if sha256_file(tmp / name) != s.sha256:
                    raise CacheError(f"{folder / s.filename}: not the sha256 its slice's manifest names")
                merged.shards.append(replace(s, filename=name))
        (tmp / MANIFEST).write_text(json.dumps(merged.to_dict(), indent=2), encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    # read back whole: every shard's checksum, every row's ids (the live check was the slices')
    verify(out, None, paths, 0, report, Policy.build(None, params.strict))
    if params.format == "speculators":
        report.extra["speculators_files"] = write_speculators(out, paths)
    took = max(seconds, 1e-9)
    report.extra.update({
        "cache/rows_per_s": report.rows_out / took, "cache/tokens_per_s": merged.tokens / took,
        "cache/mb_per_s": merged.bytes / took / 1e6, "seconds": round(seconds, 3), "slices": len(folders),
    })  # fmt: skip
    return finish(out, merged, report)


def run_ranked(params: CacheParams, ctx: RunContext, rank: int, world: int, local: tuple[int, int]) -> Report:
    """`cache-hidden` as rank `rank` of `world` ranks a launcher started (torchrun, srun; `local`: this
    rank's place on its node and the ranks there): joins the others (nccl on GPUs, gloo on CPUs) and
    builds its share of the rows (`build_ranked`)."""
    import torch
    import torch.distributed as dist

    from draftdeck.drafter.train.device import resolve_device

    device = resolve_device("auto", *local)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local[1]))
    else:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        return build_ranked(params, ctx, rank, world, device="cpu" if device.type == "cpu" else "auto")
    finally:
        leave_process_group()


def build_ranked(
    params: CacheParams, ctx: RunContext, rank: int, world: int, *, device: str = "auto"
) -> Report:
    """One rank of a build shared by a process group (joined): this rank builds its share of the rows
    (`rank_rows`) into `<out>.ranks/rank-<r>`; the ranks then gather their reports (a barrier), and rank
    0 merges the slices and returns the whole cache's report (every rank's counts in it); the other
    ranks return their slice's. A rank that failed fails every rank, its reason named."""
    import torch.distributed as dist

    from draftdeck.drafter.train.cache.build import announce, project

    t0 = time.perf_counter()
    plan = project(params)
    if rank == 0:
        announce(ctx, Path(params.out), plan)
    parts = Path(params.out).with_name(Path(params.out).name + ".ranks")
    mine: Report | BaseException
    try:
        rows = rank_rows(plan.rows, rank, world)
        mine = build_slice(params, rows, parts / f"rank-{rank:05d}", ctx, device=device)
    except Exception as e:  # said to every rank after the gather: none may wait for it forever
        mine = e
    every: list[object] = [None] * world
    dist.all_gather_object(every, mine if isinstance(mine, Report) else f"{type(mine).__name__}: {mine}")
    if not isinstance(mine, Report):
        raise mine
    failed = [f"rank {r}: {x}" for r, x in enumerate(every) if not isinstance(x, Report)]
    if failed:
        raise JobFailed("; ".join(failed))
    if rank != 0:
        return mine
    report = Report()
    for x in every:
        assert isinstance(x, Report)
        report.merge(x)
    report.outputs = []
    try:
        folders = [parts / f"rank-{r:05d}" for r in range(world)]
        return merge_slices(params, folders, report, seconds=time.perf_counter() - t0)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
