"""The Arrow shard store: HF ``save_to_disk`` layout, written atomically, read memory-mapped.

A dataset folder holds::

    data-00000-of-00003.arrow ...   Arrow IPC stream files, one record batch each (as save_to_disk)
    dataset_info.json, state.json   what ``datasets.load_from_disk`` reads
    manifest.json                   rows, bytes, sha256 per shard; tokenizer fingerprint; parameters; report
    stats.json, trained_token_counts.npy   whole-dataset statistics (see draftdeck.shards.stats)

The columns, and the two more a dataset with images has, are :mod:`draftdeck.shards.schema`'s.

Each shard is written under a temporary name, fsynced and renamed; ``state.json`` and
``manifest.json`` are written last, so a folder without a manifest is not a finished dataset.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftdeck.errors import InputError
from draftdeck.fileio import atomic_output, sha256_file
from draftdeck.shards.images import IMAGES_DIR, ImageRows, with_image_columns, write_table
from draftdeck.shards.manifest import (
    MANIFEST,
    Manifest,
    ShardInfo,
    TokenizerRef,
    read_manifest,
    write_dataset_files,
)
from draftdeck.shards.schema import COLUMNS, IMAGE_COLUMNS, features, is_multimodal, schema

__all__ = ["COLUMNS", "IMAGES_DIR", "IMAGE_COLUMNS", "MANIFEST", "Block", "Manifest", "ShardDataset",
           "ShardInfo", "ShardRow", "ShardWriter", "features", "is_multimodal", "row_mix_source",
           "row_source_name", "schema", "with_image_columns", "write_block", "write_metadata",
           "write_table"]  # fmt: skip


@dataclass
class ShardRow:
    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8 0/1
    source: str
    source_row: int
    turn: int
    truncated: bool
    issues: list[str] = field(default_factory=list)
    mix_source: str = ""  # the mix source's name ("": not from a mix)
    images: list[str] = field(default_factory=list)  # stored image file names, in order
    image_grid_thw: list[int] = field(default_factory=list)  # 3 per image: (t, h, w)

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
    issues: list[list[str]] | None = None  # per row; None: none on any row
    # per row: who answered it (draftdeck.provenance key, "" for no record); None: no record on any
    # row. Counted into the statistics and the manifest, not written as a column.
    answered_by: list[str] | None = None
    mix_sources: list[str] | None = None  # per row: its mix source ("": none); None: no row has one
    # per row: its images' stored names and their grids (3 ints each); None: a block of text rows
    images: list[list[str]] | None = None
    image_grids: list[list[int]] | None = None

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
            [r.issues for r in rows],
            None,
            [r.mix_source for r in rows] if any(r.mix_source for r in rows) else None,
            [r.images for r in rows] if any(r.images for r in rows) else None,
            [r.image_grid_thw for r in rows] if any(r.images for r in rows) else None,
        )

    def slice(self, a: int, b: int) -> Block:
        off = self.offsets
        ids, masks = self.ids[off[a] : off[b]], self.masks[off[a] : off[b]]
        return Block(ids, masks, self.lengths[a:b], self.sources[a:b], self.source_rows[a:b], self.turns[a:b],
                     self.truncated[a:b], None if self.issues is None else self.issues[a:b],
                     None if self.answered_by is None else self.answered_by[a:b],
                     None if self.mix_sources is None else self.mix_sources[a:b],
                     None if self.images is None else self.images[a:b],
                     None if self.image_grids is None else self.image_grids[a:b])  # fmt: skip

    @classmethod
    def concat(cls, blocks: list[Block]) -> Block:
        if len(blocks) == 1:
            return blocks[0]
        named = any(b.mix_sources is not None for b in blocks)
        pictured = any(b.images is not None for b in blocks)
        return cls(
            np.concatenate([b.ids for b in blocks]),
            np.concatenate([b.masks for b in blocks]),
            np.concatenate([b.lengths for b in blocks]),
            [x for b in blocks for x in b.sources],
            [x for b in blocks for x in b.source_rows],
            [x for b in blocks for x in b.turns],
            [x for b in blocks for x in b.truncated],
            [x for b in blocks for x in b.row_issues()],
            [x for b in blocks for x in b.row_answered_by()],
            [x for b in blocks for x in b.row_mix_sources()] if named else None,
            [x for b in blocks for x in b.row_images()] if pictured else None,
            [x for b in blocks for x in b.row_image_grids()] if pictured else None,
        )

    def row_issues(self) -> list[list[str]]:
        return self.issues if self.issues is not None else [[] for _ in range(len(self))]

    def row_answered_by(self) -> list[str]:
        return self.answered_by if self.answered_by is not None else [""] * len(self)

    def row_mix_sources(self) -> list[str]:
        return self.mix_sources if self.mix_sources is not None else [""] * len(self)

    def row_images(self) -> list[list[str]]:
        return self.images if self.images is not None else [[] for _ in range(len(self))]

    def row_image_grids(self) -> list[list[int]]:
        return self.image_grids if self.image_grids is not None else [[] for _ in range(len(self))]

    def n_trained(self) -> np.ndarray:
        csum = np.concatenate([[0], np.cumsum(self.masks, dtype=np.int64)])
        off = self.offsets
        return csum[off[1:]] - csum[off[:-1]]


def write_block(path: Path, b: Block, arrow_schema: pa.Schema | None = None) -> ShardInfo:
    """Write the rows of `b` as one shard at `path`, atomically (temporary name, fsync, rename)."""
    sch = arrow_schema if arrow_schema is not None else schema()
    off = b.offsets
    if off[-1] > np.iinfo(np.int32).max:
        raise ValueError("a shard would hold more than 2**31 tokens; use a smaller --shard-rows")
    off32 = pa.array(off.astype(np.int32))
    columns = [
        pa.ListArray.from_arrays(off32, pa.array(b.ids.astype(np.int32, copy=False))),
        pa.ListArray.from_arrays(off32, pa.array(b.masks.astype(np.int64))),
        pa.array(b.lengths, pa.int64()),
        pa.array(b.sources, pa.string()),
        pa.array(b.source_rows, pa.int64()),
        pa.array(b.turns, pa.int32()),
        pa.array(b.n_trained(), pa.int64()),
        pa.array(b.truncated, pa.bool_()),
        pa.array(b.row_issues(), pa.list_(pa.string())),
        pa.array(b.row_mix_sources(), pa.string()),
    ]
    if is_multimodal(sch):
        columns.append(pa.array(b.row_images(), pa.list_(pa.string())))
        columns.append(pa.array(b.row_image_grids(), pa.list_(pa.int32())))
    elif b.images is not None and any(b.images):
        raise ValueError("rows with images written with the text schema: their images would be lost")
    batch = pa.record_batch(columns, schema=sch)
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

    @property
    def multimodal(self) -> bool:
        return is_multimodal(self._schema)

    def add_block(self, block: Block) -> None:
        if not len(block):
            return
        if block.images is not None and not self.multimodal:
            self._to_multimodal()
        self._buf.append(block)
        self._buffered += len(block)
        while self._buffered >= self.shard_rows:
            whole = Block.concat(self._buf)
            self._write(whole.slice(0, self.shard_rows))
            rest = whole.slice(self.shard_rows, len(whole))
            self._buf = [rest] if len(rest) else []
            self._buffered = len(rest)

    def _to_multimodal(self) -> None:
        """The first rows with images: the dataset takes the image columns, and the shards written so
        far (text rows only) are written again with them, empty, so that every shard has one schema."""
        self._schema = schema(multimodal=True)
        for i, info in enumerate(self.shards):
            path = self.out_dir / info.filename
            with pa.memory_map(str(path), "r") as src:
                table = pa.ipc.open_stream(src).read_all()
            self.shards[i] = write_table(path, with_image_columns(table, schema(), self._schema))

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


def write_metadata(out_dir: Path, manifest: Manifest) -> None:
    """dataset_info.json + state.json (for datasets.load_from_disk), then manifest.json, atomically."""
    write_dataset_files(out_dir, manifest, features(multimodal=manifest.images is not None))


def write_pretokenized_metadata(
    out_dir: Path,
    shards: list[ShardInfo],
    *,
    fingerprint: str,
    chat_template: str | None,
    tokenizer_path: Path | None = None,
) -> None:
    """The metadata of rows a program tokenized itself (tests, benchmarks, generated answers): the
    tokenizer's fingerprint and template, no template kwargs, so that a trainer's tokenizer check
    holds them to the same rule as a tokenize job's output."""
    write_metadata(
        out_dir,
        Manifest(
            shards=shards,
            tokenizer=TokenizerRef(
                path=str(tokenizer_path) if tokenizer_path else None,
                fingerprint=fingerprint,
                chat_template=chat_template,
            ),
            parameters={"template_kwargs": {}},
        ),
    )


def row_mix_source(row: dict[str, Any]) -> str:
    """A row's mix source name: "" when it has none, or its shard predates the column."""
    return str(row.get("mix_source") or "")


def row_source_name(row: dict[str, Any]) -> str:
    """What per-source figures group a row by: its mix source's name, else its original file."""
    return row_mix_source(row) or str(row["source"])


class RowOutOfRange(InputError, IndexError):
    """A row number the dataset does not have."""


class ShardDataset(ImageRows):
    """Random access to the rows of a dataset folder, memory-mapped; the one reader of the project.

    ``row(n)`` costs one binary search over the shard offsets and a zero-copy slice of one shard: it
    does not grow with the size of the dataset. Whole columns (for filters, search and alerts) are the
    shards' record batches, zero-copy, joined on first use. A DraftDeck folder is read from its
    :class:`Manifest`; a folder written by HF ``save_to_disk`` (a peer's data, no manifest) from its
    ``state.json``, whose Arrow files have the same layout. Safe to share between threads.
    """

    def __init__(self, path: Path | str, *, max_open: int = 8):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.written_by_draftdeck = True
        self._setup(max_open)

    @classmethod
    def open(cls, path: Path | str, *, max_open: int = 8) -> ShardDataset:
        """A DraftDeck dataset folder, or one written by HF ``save_to_disk`` (``state.json``, no manifest)."""
        folder = Path(path)
        if (folder / MANIFEST).exists() or not (folder / "state.json").exists():
            return cls(folder, max_open=max_open)
        self = cls.__new__(cls)
        self.path, self.manifest = folder, Manifest(shards=_saved_shards(folder))
        self.written_by_draftdeck = False
        self._setup(max_open)
        return self

    def _setup(self, max_open: int) -> None:
        self.shards = self.manifest.shards
        self._starts = [0]
        for s in self.shards:
            self._starts.append(self._starts[-1] + s.rows)
        self._open: OrderedDict[int, pa.Table] = OrderedDict()
        self._max_open = max_open
        self._lock = threading.RLock()
        self._whole: pa.Table | None = None
        self._derived: dict[str, Any] = {}

    def __len__(self) -> int:
        return self._starts[-1]

    def _table(self, i: int) -> pa.Table:
        with self._lock:
            table = self._open.get(i)
            if table is not None:
                self._open.move_to_end(i)
                return table
            name = self.shards[i].filename
            try:
                table = pa.ipc.open_stream(pa.memory_map(str(self.path / name), "r")).read_all()
            except (OSError, pa.ArrowException) as exc:
                raise InputError(f"shard {name} cannot be read ({type(exc).__name__}: {exc})") from exc
            if table.num_rows != self.shards[i].rows:
                raise InputError(
                    f"shard {name} holds {table.num_rows} rows, the manifest says {self.shards[i].rows}"
                )
            self._open[i] = table
            if len(self._open) > self._max_open:
                self._open.popitem(last=False)
            return table

    def locate(self, n: int) -> tuple[int, int]:
        if not 0 <= n < len(self):
            if not len(self):
                raise RowOutOfRange(f"row {n} is out of range: this dataset has no rows")
            raise RowOutOfRange(f"row {n} is out of range: this dataset has rows 0 to {len(self) - 1:,}")
        shard = bisect.bisect_right(self._starts, n) - 1
        return shard, n - self._starts[shard]

    def row(self, n: int) -> dict[str, Any]:
        shard, local = self.locate(n)
        try:
            return self._table(shard).slice(local, 1).to_pylist()[0]
        except InputError as exc:
            raise InputError(f"row {n} cannot be read: {exc}") from exc

    def iter_batches(self) -> Iterator[pa.RecordBatch]:
        for i in range(len(self.shards)):
            yield from self._table(i).to_batches()

    @property
    def schema(self) -> pa.Schema:
        if not self.shards:
            return schema()
        first = self.path / self.shards[0].filename
        try:
            with pa.memory_map(str(first), "r") as source:
                return pa.ipc.open_stream(source).schema
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"shard {first.name} cannot be read ({type(exc).__name__}: {exc})") from exc

    @property
    def table(self) -> pa.Table:
        """Every row as one Arrow table over the memory-mapped shards (zero-copy, built once)."""
        with self._lock:
            if self._whole is None:
                batches = [b for i in range(len(self.shards)) for b in self._mapped(i).to_batches()]
                self._whole = pa.Table.from_batches(batches, schema=self.schema if not batches else None)
            return self._whole

    def _mapped(self, i: int) -> pa.Table:
        """Shard `i` outside the LRU: the whole table keeps every shard mapped anyway."""
        with self._lock:
            return self._open.get(i) or self._table(i)

    def column(self, name: str) -> pa.ChunkedArray | None:
        table = self.table
        return table.column(name) if name in table.column_names else None

    def take_ids(self, rows: np.ndarray) -> list[list[int]]:
        return self.table.column("input_ids").take(pa.array(rows)).to_pylist()

    def lengths(self) -> np.ndarray:
        """Tokens per row (int64), from ``seq_len`` when stored."""

        def compute() -> np.ndarray:
            stored = self.column("seq_len")
            if stored is None:
                stored = pc.list_value_length(self.table.column("input_ids"))
            return np.asarray(stored.to_numpy(zero_copy_only=False), dtype=np.int64)

        return self.derived("lengths", compute)

    def n_trained(self) -> np.ndarray:
        """Trained tokens per row (int64), from ``n_trained`` when stored, else summed from the masks."""

        def compute() -> np.ndarray:
            stored = self.column("n_trained")
            if stored is not None:
                return np.asarray(stored.to_numpy(zero_copy_only=False), dtype=np.int64)
            out = np.zeros(len(self), dtype=np.int64)
            at = 0
            for chunk in self.table.column("loss_mask").chunks:
                flat = chunk.flatten().to_numpy(zero_copy_only=False)
                offsets = chunk.offsets.to_numpy()
                sums = np.add.reduceat(flat, offsets[:-1]) if len(flat) else np.zeros(len(chunk))
                sums[offsets[:-1] == offsets[1:]] = 0
                out[at : at + len(chunk)] = sums
                at += len(chunk)
            return out

        return self.derived("n_trained", compute)

    def derived(self, key: str, make: Callable[[], Any]) -> Any:
        """A value computed from the whole dataset once (the data does not change under a reader)."""
        with self._lock:
            if key not in self._derived:
                self._derived[key] = make()
            return self._derived[key]


def _saved_shards(folder: Path) -> list[ShardInfo]:
    """The shards of a ``save_to_disk`` folder, from its state.json (rows counted from the files)."""
    where = folder / "state.json"
    try:
        files = json.loads(where.read_text(encoding="utf-8"))["_data_files"]
        names = [str(f["filename"]) for f in files]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{where} cannot be read as a datasets state file ({type(exc).__name__}: {exc})"
        ) from exc
    shards = []
    for name in names:
        path = folder / Path(name).name
        try:
            with pa.memory_map(str(path), "r") as source:
                rows = sum(b.num_rows for b in pa.ipc.open_stream(source))
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"shard {name} cannot be read ({type(exc).__name__}: {exc})") from exc
        shards.append(ShardInfo(path.name, rows, path.stat().st_size, ""))
    return shards
