"""`train --hidden-states-cache CACHE` when CACHE is not there yet (one process): the first epoch fills it.

The first epoch trains online, the whole target in memory: every forward is the online run's, so its
losses are. `FillingTarget` keeps, as each forward runs, every attended row's states of the layers the
cache stores (the drafter's and the final one), in the order the rows are read, spilled to
`<CACHE>.filling/` in safetensors files (`SPILL_BYTES` at a time). When the first epoch is over,
`Filling.finish` writes the cache in the datasets' row order with the `cache-hidden` job's own code
(build.py's `fill`: every row checked, the first rows compared with a live forward, the whole read back,
the folder named only when whole), taking each row from the spill, or from a forward of its own for the
rows the epoch did not read (an epoch's tail shorter than a batch, held-out rows no pass has read yet);
the spill is then deleted, and the run reads the cache from the second epoch on, its target's decoder
layers released.

A start that dies mid-epoch leaves `<CACHE>.filling/`, never `CACHE`: nothing reads a spill but the
process that wrote it. The next start (a resume from the last checkpoint) discards it and fills anew
from where it resumes; the rows read before the checkpoint are computed again when the epoch ends.
A start resumed after the first epoch finishes the cache before its first step."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.cache.first import Building
from draftdeck.hidden.store import DTYPES, ShardFile, row_key
from draftdeck.jobs.context import RunContext

if TYPE_CHECKING:
    from draftdeck.drafter.train.cache.params import CacheParams
    from draftdeck.drafter.train.data import TrainData
    from draftdeck.drafter.train.params import TrainParams

SPILL = ".filling"  # beside the cache folder: `<CACHE>.filling`
SPILL_BYTES = 256 << 20  # states kept in memory before they are written to a spill file


class Spill:
    """Rows' states in the order read, by their ids (`row_key`): in memory, then in spill files."""

    def __init__(self, folder: Path, dtype: torch.dtype):
        self.folder, self.dtype = folder, dtype
        shutil.rmtree(folder, ignore_errors=True)  # an earlier start's: never read (see the docstring)
        folder.mkdir(parents=True)
        self.pending: dict[bytes, tuple[torch.Tensor, torch.Tensor]] = {}
        self.bytes = 0
        self.files: list[ShardFile] = []
        self.index: dict[bytes, tuple[int, int, int]] = {}  # key -> (file, start, end)

    def __contains__(self, key: bytes) -> bool:
        return key in self.pending or key in self.index

    def add(self, ids: torch.Tensor, states: torch.Tensor) -> None:
        key = row_key(ids)
        if key in self:
            return  # the same ids read again (another epoch's pass, a duplicate row): the same states
        stored = states.to("cpu", self.dtype).contiguous()
        self.pending[key] = (ids.to("cpu", torch.int32), stored)
        self.bytes += stored.numel() * stored.element_size()
        if self.bytes >= SPILL_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        from safetensors.torch import save_file

        keys = list(self.pending)
        lengths = [len(self.pending[k][0]) for k in keys]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        path = self.folder / f"spill-{len(self.files):05d}.safetensors"
        tensors = {
            "hidden": torch.cat([self.pending[k][1] for k in keys]),
            "ids": torch.cat([self.pending[k][0] for k in keys]),
            "offsets": torch.from_numpy(offsets.astype(np.int64)),
        }
        save_file(tensors, str(path))
        for k, key in enumerate(keys):
            self.index[key] = (len(self.files), int(offsets[k]), int(offsets[k + 1]))
        self.files.append(ShardFile(path))
        self.pending, self.bytes = {}, 0

    def take(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(states, ids) of the row with these ids, or None when no pass read it."""
        key = row_key(ids)
        if key in self.pending:
            got_ids, states = self.pending[key]
            return states, got_ids
        if key not in self.index:
            return None
        f, start, end = self.index[key]
        return self.files[f].rows("hidden", start, end), self.files[f].rows("ids", start, end)

    def discard(self) -> None:
        self.files, self.pending = [], {}
        shutil.rmtree(self.folder, ignore_errors=True)


class FillingTarget(Target):
    """The whole target, whose every forward also hands each attended row's states of `layers` (HF
    hidden_states indices) to the spill: what the online run computes anyway."""

    def __init__(self, target: Target, layers: list[int], spill: Spill):
        super().__init__(target.model, target.folder, target.tokenizer, loaded=target.loaded)
        self.vision, self.vocab, self.sharded = target.vision, target.vocab, target.sharded
        self.layers, self.spill = layers, spill

    def _forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, logits_to_keep: int
    ) -> Any:
        out = super()._forward(input_ids, attention_mask, logits_to_keep)
        states = torch.stack([out.hidden_states[j] for j in self.layers], dim=2)  # (bsz, T, layers, H)
        for i in range(input_ids.shape[0]):
            at = attention_mask[i].bool() if attention_mask is not None else slice(None)
            self.spill.add(input_ids[i][at], states[i][at])
        return out


class Filling:
    """The first epoch's cache in the making: its target, its spill, and what `finish` writes."""

    def __init__(self, params: TrainParams, cache: CacheParams, target: FillingTarget, layers: list[int]):
        self.params, self.cache, self.target, self.layers = params, cache, target, layers

    @classmethod
    def start(cls, params: TrainParams, target: Target, device: torch.device) -> Filling:
        from draftdeck.drafter.train.cache.build import project
        from draftdeck.drafter.train.cache.first import cache_params

        cache = cache_params(params, cpu=device.type == "cpu")
        layers = project(cache).layers
        spill = Spill(_spill_folder(cache.out), DTYPES[cache.dtype])
        return cls(params, cache, FillingTarget(target, layers, spill), layers)

    def finish(self, ctx: RunContext, device: torch.device, data: TrainData, layer_ids: list[int]) -> Target:
        """Write the cache (every row: the spill's, or a forward of its own), delete the spill, and
        return the run's target from now on: the cache's (`CachedTarget`), decoder layers released,
        checked against the run's data and the drafter's layers as a cache given at the start is."""
        from draftdeck.drafter.model.cached_target import CachedTarget, check_cache
        from draftdeck.drafter.train.cache.build import announce, fill, live_rows, manifest_for, project

        spill, target = self.target.spill, self.target
        spill.flush()
        plan = project(self.cache)
        building = _Finishing(ctx)
        announce(building, Path(self.cache.out), plan)
        mf = manifest_for(self.cache, target.num_layers, plan.hidden, plan.layers)
        computed = 0

        def produce(index: int, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal computed
            got = spill.take(ids)
            if got is not None:
                return got
            computed += 1  # a row no pass of the first epoch read
            return live_rows(target, ids, self.layers), torch.from_numpy(ids)

        try:
            report = fill(self.cache, building, plan, mf, target, produce)
        finally:
            spill.discard()
        x = report.extra
        ctx.event(
            "info",
            f"hidden_states_cache {self.cache.out}: filled during the first epoch: {report.rows_out:,} rows"
            f" ({report.rows_out - computed:,} as the epoch read them, {computed:,} read by no pass and"
            f" computed at its end), {x['tokens']:,} tokens, hidden_states {x['layers']} in {x['dtype']};"
            " the later epochs and every later start read it",
        )
        dtype = torch.bfloat16 if device.type == "cuda" else None  # as the trainer loads its target
        cached = CachedTarget.open(self.cache.out, self.params.target, device=device, dtype=dtype)
        check_cache(cached, data, layer_ids)
        return cached


def first_epoch_fill(
    params: TrainParams, target: Target, device: torch.device
) -> tuple[Filling | None, Target]:
    """The trainer's hook: for a `hidden_states_cache` not there yet (cache/first.py), the first epoch's
    filling and the target that fills it as its forwards run; otherwise none, and the target as it is."""
    if not params.hidden_states_cache:
        return None, target
    filling = Filling.start(params, target, device)
    return filling, filling.target


class _Finishing(Building):
    """The train job's context as the fill's end sees it: its log and cancel; its progress stays the run's
    steps (the rows written are said once, in the log)."""

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        self.ctx.check_cancelled()


def _spill_folder(out: str) -> Path:
    return Path(out).with_name(Path(out).name + SPILL)
