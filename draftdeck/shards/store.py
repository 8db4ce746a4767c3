"""The Arrow shard store: HF ``save_to_disk`` layout, written atomically, read memory-mapped.

A dataset folder holds::

    data-00000-of-00003.arrow ...   Arrow IPC stream files, one record batch each (as save_to_disk)
    dataset_info.json, state.json   what ``datasets.load_from_disk`` reads
    manifest.json                   rows, bytes, sha256 per shard; tokenizer fingerprint; parameters; report
    stats.json, trained_token_counts.npy   whole-dataset statistics (see draftdeck.shards.stats)

Columns (speculators' names and meanings): ``input_ids`` list<int32>, ``loss_mask`` list<int64>
(1 = the token is trained), ``seq_len`` int64, plus ``source`` (input file), ``source_row``
(line or index in it), ``turn`` (the supervised assistant turn of a split row, -1 when every
assistant turn of the conversation is supervised), ``n_trained`` and ``truncated``.

Each shard is written under a temporary name, fsynced and renamed; ``state.json`` and
``manifest.json`` are written last, so a folder without a manifest is not a finished dataset.
"""

from __future__ import annotations

import bisect
import json
import os
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from draftdeck.errors import InputError
from draftdeck.fileio import atomic_output, sha256_file

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def _features() -> Any:
    from datasets import Features, List, Value

    return Features(
        {
            "input_ids": List(Value("int32")),
            "loss_mask": List(Value("int64")),
            "seq_len": Value("int64"),
            "source": Value("string"),
            "source_row": Value("int64"),
            "turn": Value("int32"),
            "n_trained": Value("int64"),
            "truncated": Value("bool"),
        }
    )


def schema() -> pa.Schema:
    return _features().arrow_schema


@dataclass
class ShardRow:
    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8 0/1
    source: str
    source_row: int
    turn: int
    truncated: bool

    @property
    def n_trained(self) -> int:
        return int(self.loss_mask.sum())


@dataclass
class Block:
    """Rows in columns: token ids and masks of all rows concatenated, with their lengths. This is what
    workers send back (cheap to pickle) and what shards are cut from."""

    ids: np.ndarray  # int32, all rows concatenated
    masks: np.ndarray  # uint8, all rows concatenated
    lengths: np.ndarray  # int64, tokens per row
    sources: list[str]
    source_rows: list[int]
    turns: list[int]
    truncated: list[bool]

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def offsets(self) -> np.ndarray:
        off = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=off[1:])
        return off

    @classmethod
    def from_rows(cls, rows: list[ShardRow]) -> Block:
        return cls(
            np.concatenate([r.input_ids for r in rows]).astype(np.int32) if rows else np.zeros(0, np.int32),
            np.concatenate([r.loss_mask for r in rows]).astype(np.uint8) if rows else np.zeros(0, np.uint8),
            np.asarray([len(r.input_ids) for r in rows], dtype=np.int64),
            [r.source for r in rows],
            [r.source_row for r in rows],
            [r.turn for r in rows],
            [r.truncated for r in rows],
        )

    def slice(self, a: int, b: int) -> Block:
        off = self.offsets
        ids, masks = self.ids[off[a] : off[b]], self.masks[off[a] : off[b]]
        return Block(ids, masks, self.lengths[a:b], self.sources[a:b], self.source_rows[a:b], self.turns[a:b],
                     self.truncated[a:b])  # fmt: skip

    @classmethod
    def concat(cls, blocks: list[Block]) -> Block:
        if len(blocks) == 1:
            return blocks[0]
        return cls(
            np.concatenate([b.ids for b in blocks]),
            np.concatenate([b.masks for b in blocks]),
            np.concatenate([b.lengths for b in blocks]),
            [x for b in blocks for x in b.sources],
            [x for b in blocks for x in b.source_rows],
            [x for b in blocks for x in b.turns],
            [x for b in blocks for x in b.truncated],
        )

    def n_trained(self) -> np.ndarray:
        csum = np.concatenate([[0], np.cumsum(self.masks, dtype=np.int64)])
        off = self.offsets
        return csum[off[1:]] - csum[off[:-1]]


@dataclass
class ShardInfo:
    filename: str
    rows: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}


def write_block(path: Path, b: Block, arrow_schema: pa.Schema | None = None) -> ShardInfo:
    """Write the rows of `b` as one shard at `path`, atomically (temporary name, fsync, rename)."""
    sch = arrow_schema if arrow_schema is not None else schema()
    off = b.offsets
    if off[-1] > np.iinfo(np.int32).max:
        raise ValueError("a shard would hold more than 2**31 tokens; use a smaller --shard-rows")
    off32 = pa.array(off.astype(np.int32))
    batch = pa.record_batch(
        [
            pa.ListArray.from_arrays(off32, pa.array(b.ids.astype(np.int32, copy=False))),
            pa.ListArray.from_arrays(off32, pa.array(b.masks.astype(np.int64))),
            pa.array(b.lengths, pa.int64()),
            pa.array(b.sources, pa.string()),
            pa.array(b.source_rows, pa.int64()),
            pa.array(b.turns, pa.int32()),
            pa.array(b.n_trained(), pa.int64()),
            pa.array(b.truncated, pa.bool_()),
        ],
        schema=sch,
    )
    with atomic_output(path) as f, pa.ipc.new_stream(f, sch) as w:
        w.write_batch(batch)
    return ShardInfo(path.name, len(b), path.stat().st_size, sha256_file(path))


class ShardWriter:
    """Buffers rows; writes a shard of `shard_rows` rows whenever the buffer is full."""

    def __init__(self, out_dir: Path, shard_rows: int = 10_000):
        if shard_rows < 1:
            raise ValueError("shard_rows must be at least 1")
        self.out_dir = out_dir
        self.shard_rows = shard_rows
        self.shards: list[ShardInfo] = []
        self._buf: list[Block] = []
        self._buffered = 0
        self._schema = schema()
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, row: ShardRow) -> None:
        self.add_block(Block.from_rows([row]))

    def add_block(self, block: Block) -> None:
        if not len(block):
            return
        self._buf.append(block)
        self._buffered += len(block)
        while self._buffered >= self.shard_rows:
            whole = Block.concat(self._buf)
            self._write(whole.slice(0, self.shard_rows))
            rest = whole.slice(self.shard_rows, len(whole))
            self._buf = [rest] if len(rest) else []
            self._buffered = len(rest)

    def _flush(self) -> None:
        if self._buf:
            self._write(Block.concat(self._buf))
        self._buf = []
        self._buffered = 0

    def _write(self, b: Block) -> None:
        path = self.out_dir / f"part-{len(self.shards):05d}.arrow"
        self.shards.append(write_block(path, b, self._schema))

    def close(self) -> list[ShardInfo]:
        """Write the last partial shard and give the shards their final `data-i-of-n` names."""
        self._flush()
        n = len(self.shards)
        for i, info in enumerate(self.shards):
            final = f"data-{i:05d}-of-{n:05d}.arrow"
            os.replace(self.out_dir / info.filename, self.out_dir / final)
            info.filename = final
        return self.shards

    def discard(self) -> None:
        """Remove every shard written so far (a failed or restarted job)."""
        self._buf = []
        self._buffered = 0
        for info in self.shards:
            (self.out_dir / info.filename).unlink(missing_ok=True)
        self.shards = []


def write_metadata(out_dir: Path, shards: list[ShardInfo], manifest: dict[str, Any]) -> None:
    """dataset_info.json + state.json (for datasets.load_from_disk), then manifest.json, atomically."""
    info = {
        "citation": "",
        "description": "DraftDeck tokenized chat data (input_ids, loss_mask)",
        "features": _features().to_dict(),
        "homepage": "",
        "license": "",
    }
    with atomic_output(out_dir / "dataset_info.json", "w") as f:
        json.dump(info, f, indent=2)
    state: dict[str, Any] = {
        "_data_files": [{"filename": s.filename} for s in shards],
        "_fingerprint": secrets.token_hex(8),
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    with atomic_output(out_dir / "state.json", "w") as f:
        json.dump(state, f, indent=2)
    body = {
        "format": "draftdeck-shards",
        "version": FORMAT_VERSION,
        "rows": sum(s.rows for s in shards),
        "shards": [s.to_dict() for s in shards],
        **manifest,
    }
    with atomic_output(out_dir / MANIFEST, "w") as f:
        json.dump(body, f, indent=2, ensure_ascii=False)


class ShardDataset:
    """Random access to the rows of a dataset folder; shards are memory-mapped, opened on demand.

    ``row(n)`` costs one binary search over the shard offsets and a zero-copy slice of one shard:
    it does not grow with the size of the dataset.
    """

    def __init__(self, path: Path | str, *, max_open: int = 8):
        self.path = Path(path)
        mf = self.path / MANIFEST
        if not mf.is_file():
            raise InputError(f"{self.path} is not a DraftDeck dataset (no {MANIFEST}; was the job finished?)")
        self.manifest: dict[str, Any] = json.loads(mf.read_text(encoding="utf-8"))
        self.shards = [ShardInfo(**s) for s in self.manifest["shards"]]
        self._starts = [0]
        for s in self.shards:
            self._starts.append(self._starts[-1] + s.rows)
        self._open: OrderedDict[int, pa.Table] = OrderedDict()
        self._max_open = max_open

    def __len__(self) -> int:
        return self._starts[-1]

    def _table(self, i: int) -> pa.Table:
        table = self._open.get(i)
        if table is None:
            source = pa.memory_map(str(self.path / self.shards[i].filename), "r")
            table = pa.ipc.open_stream(source).read_all()
            self._open[i] = table
            if len(self._open) > self._max_open:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(i)
        return table

    def locate(self, n: int) -> tuple[int, int]:
        if not 0 <= n < len(self):
            raise IndexError(f"row {n} is out of range: the dataset has {len(self)} rows")
        shard = bisect.bisect_right(self._starts, n) - 1
        return shard, n - self._starts[shard]

    def row(self, n: int) -> dict[str, Any]:
        shard, local = self.locate(n)
        return self._table(shard).slice(local, 1).to_pylist()[0]

    def iter_batches(self) -> Any:
        for i in range(len(self.shards)):
            yield from self._table(i).to_batches()
