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
class ShardInfo:
    filename: str
    rows: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}


def _list_array(arrays: list[np.ndarray], dtype: Any) -> pa.ListArray:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


class ShardWriter:
    """Buffers rows; writes a shard of `shard_rows` rows whenever the buffer is full."""

    def __init__(self, out_dir: Path, shard_rows: int = 10_000):
        if shard_rows < 1:
            raise ValueError("shard_rows must be at least 1")
        self.out_dir = out_dir
        self.shard_rows = shard_rows
        self.shards: list[ShardInfo] = []
        self._buf: list[ShardRow] = []
        self._schema = schema()
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, row: ShardRow) -> None:
        self._buf.append(row)
        if len(self._buf) >= self.shard_rows:
            self._flush()

    def _flush(self) -> None:
        rows, self._buf = self._buf, []
        if not rows:
            return
        batch = pa.record_batch(
            [
                _list_array([r.input_ids for r in rows], np.int32),
                _list_array([r.loss_mask for r in rows], np.int64),
                pa.array([len(r.input_ids) for r in rows], pa.int64()),
                pa.array([r.source for r in rows], pa.string()),
                pa.array([r.source_row for r in rows], pa.int64()),
                pa.array([r.turn for r in rows], pa.int32()),
                pa.array([r.n_trained for r in rows], pa.int64()),
                pa.array([r.truncated for r in rows], pa.bool_()),
            ],
            schema=self._schema,
        )
        path = self.out_dir / f"part-{len(self.shards):05d}.arrow"
        with atomic_output(path) as f, pa.ipc.new_stream(f, self._schema) as w:
            w.write_batch(batch)
        self.shards.append(ShardInfo(path.name, len(rows), path.stat().st_size, sha256_file(path)))

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
