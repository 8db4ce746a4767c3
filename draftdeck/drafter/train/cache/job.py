"""The `cache-hidden` job's entry: build a cache in this process, take in the field's files, or, as one of
the ranks a launcher started, build this rank's slice (slices.py). Above build.py and slices.py, which
it chooses between, so that neither imports the other to dispatch."""

from __future__ import annotations

from draftdeck.drafter.train.cache.build import build_cache, import_speculators
from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.drafter.train.cache.slices import run_ranked
from draftdeck.drafter.train.launched import Launched
from draftdeck.jobs.context import RunContext
from draftdeck.quality import Report


def run_cache_hidden(params: CacheParams, ctx: RunContext) -> Report:
    """The `cache-hidden` job: build a cache (or take in speculators' files with `import_from`). As one
    of the ranks a launcher started (torchrun, srun), each rank builds a slice of the rows and rank 0
    merges them (slices.py)."""
    if params.import_from is not None:
        return import_speculators(params, ctx)
    where = Launched.from_env()
    if where is not None:
        return run_ranked(params, ctx, where.rank, where.world, (where.local_rank, where.local_world))
    return build_cache(params, ctx)
