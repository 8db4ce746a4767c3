"""What a hidden-state cache takes on disk, said before anything is built: the HF `hidden_states`
indices it stores, its bytes (rows x tokens x layers x hidden x bytes per value), a zstd estimate (the
figure the disk check reads when the cache is stored compressed), and the refusal when the out folder's
disk cannot hold it. Read by the cache's job and by `draftdeck plan`."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftdeck.errors import UsageError
from draftdeck.hidden.store import DTYPES
from draftdeck.shards.store import ShardDataset
from draftdeck.units import binary_size


def stored_layers(target_ids: list[int], num_layers: int) -> list[int]:
    """HF hidden_states indices stored: each id's i + 1, and the final layer (after the norm) last."""
    bad = [i for i in target_ids if not -1 <= i < num_layers]  # -1: the embeddings (EAGLE-3 on a tiny target)
    if bad:
        raise UsageError(f"layer ids {bad} do not exist: the target has layers 0..{num_layers - 1}")
    return [*sorted({i + 1 for i in target_ids} - {num_layers}), num_layers]


def disk_needed(tokens: int, layers: int, hidden: int, dtype: str) -> int:
    """Bytes of the hidden states: tokens x layers x hidden x bytes per value (ids and headers aside)."""
    return tokens * layers * hidden * DTYPES[dtype].itemsize


def check_disk(out: Path, need: int) -> int:
    """The free bytes where `out` will be written; refuses when they cannot hold `need`."""
    at = out
    while not at.exists():
        at = at.parent
    free = shutil.disk_usage(at).free
    if need > free:
        raise UsageError(
            f"{out}: the cache takes {binary_size(need)} ({need:,} bytes) but its disk has "
            f"{binary_size(free)} ({free:,} bytes) free"
        )
    return free


# what `--compress zstd` (level 3, byte planes) made of each stored dtype's hidden states, measured by
# benchmarks/hidden_cache.py on the demo world's trained target (`draftdeck demo --quick`'s); a real
# model's states may compress otherwise, so a figure from it is an estimate
ZSTD_RATIOS = {"bf16": 1.33, "fp16": 1.08, "fp32": 1.11}
ZSTD_RATIO = ZSTD_RATIOS["bf16"]


@dataclass(frozen=True)
class Projection:
    """What a cache will hold, from the target's config and the datasets' lengths (no weight read)."""

    rows: int
    tokens: int
    layers: list[int]  # HF hidden_states indices, the final layer last
    hidden: int
    dtype: str
    copies: int = 1  # 2 with speculators' files beside the cache (never compressed)
    compression: str | None = None  # "zstd:LEVEL": the cache's shards stored so

    @property
    def bytes(self) -> int:
        """Uncompressed: rows x tokens x layers x hidden x bytes (x 2 with speculators' files)."""
        return self.copies * disk_needed(self.tokens, len(self.layers), self.hidden, self.dtype)

    @property
    def zstd_bytes(self) -> int:
        """About what zstd makes of the cache's states (`ZSTD_RATIOS`, measured on the demo world: an
        estimate); speculators' files beside it stay uncompressed."""
        one = disk_needed(self.tokens, len(self.layers), self.hidden, self.dtype)
        return int(one / ZSTD_RATIOS[self.dtype]) + (self.copies - 1) * one

    @property
    def disk_bytes(self) -> int:
        """What the build needs free: the compressed estimate when it compresses, else `bytes`."""
        return self.zstd_bytes if self.compression else self.bytes

    def said(self) -> str:
        twice = " x 2 (the cache and speculators' files)" if self.copies == 2 else ""
        ratio = f"x{ZSTD_RATIOS[self.dtype]} measured for {self.dtype} on the demo world"
        zstd = binary_size(self.zstd_bytes)
        compressed = (
            f"; stored with {self.compression}: about {zstd} ({self.zstd_bytes:,} bytes, estimated: {ratio})"
            if self.compression
            else f"; with --compress zstd about {zstd} (estimated: {ratio})"
        )
        return (
            f"the cache takes {binary_size(self.bytes)} ({self.bytes:,} bytes): {self.rows:,}"
            f" row{'s' if self.rows != 1 else ''}, {self.tokens:,} tokens x {len(self.layers)} layers x"
            f" {self.hidden:,} hidden x {DTYPES[self.dtype].itemsize} bytes ({self.dtype}){twice}{compressed}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "rows": self.rows, "tokens": self.tokens, "layers": self.layers, "hidden": self.hidden,
            "dtype": self.dtype, "bytes": self.bytes, "compression": self.compression,
            "zstd_bytes_estimate": self.zstd_bytes, "zstd_ratio_measured": ZSTD_RATIOS[self.dtype],
            "disk_bytes": self.disk_bytes,
        }  # fmt: skip


def sized(
    inputs: list[str], seq_length: int | None, layers: list[int], hidden: int, dtype: str, copies: int = 1,
    compression: str | None = None,
) -> Projection:  # fmt: skip
    """The rows and tokens of the datasets `inputs` (cut at seq_length) as a cache of `layers`."""
    sets = [ShardDataset(p) for p in inputs]
    tokens = sum(int(np.minimum(ds.lengths(), seq_length or 1 << 62).sum()) for ds in sets)
    return Projection(sum(len(ds) for ds in sets), tokens, layers, hidden, dtype, copies, compression)
