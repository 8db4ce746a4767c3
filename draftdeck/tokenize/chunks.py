"""Tokenizing in chunks: how a large input becomes many independent tasks and one dataset.

Three steps, each a plain function (no Celery, no SQL: ``app/run/chunks.py`` runs them as tasks):

1. :func:`plan_chunks` reads the inputs ONCE, in order, through the conversion reader (the same
   reading as ``draftdeck tokenize``: detection, checks, duplicate and placeholder detection, which
   need the whole input in order), and writes the kept conversations, template-ready, into chunk
   files of ``chunk_rows`` conversations each (``input-00000.jsonl`` ...) plus ``plan.json`` (the
   reading stage's report and the chunk list). There is always at least one chunk (maybe empty).
2. :func:`tokenize_chunk` renders, encodes, masks and checks one chunk (exactly the rows'
   processing of the in-process run) and writes its rows as ONE shard ``chunk-0000i.arrow`` in the
   dataset folder, atomically, with its statistics beside the chunk files. Chunks are independent:
   any process, any machine, any order.
3. :func:`finish_chunks` checks that every chunk is there and that the counts add up (the rows of
   the chunk shards = rows out of the merged report; each shard's size is the one recorded), merges
   reports and statistics in chunk order, applies the policy, gives the non-empty chunk shards their
   final ``data-0000i-of-0000N`` names in chunk order, and writes statistics and the manifest
   (:func:`draftdeck.tokenize.pipeline.conclude`, the same end as the in-process run).

The rows, their order and their data are those of the in-process run for the same input and
options, and so is the cut between shards: the final step rewrites the chunk shards (one per
non-empty chunk) as shards of ``shard_rows`` output rows (:func:`recut`), unless they are cut so
already. Chunk files are JSON lines, one :class:`~draftdeck.tokenize.rows.Item` each (what the
process pool sends its workers), never pickles: they lie in a job folder under a path the user chose,
where anyone who can write there could plant one, and reading a pickle runs what it holds.

Fast encoder: every chunk checks all rows of its first batch and then one row in ``verify_every``
against the HF tokenizer. A mismatch re-runs that chunk on the HF tokenizer and leaves a marker
(``encoder-fallback``) so that chunks starting later use HF too; the final step then asks for every
chunk that ran on the fast encoder to run again on HF (:class:`RerunChunks`), as the in-process run
runs the whole job again on HF: the rows are the same either way. ``encoder_mismatch`` in the report
counts the mismatched rows found.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
import pyarrow as pa

from draftdeck.errors import AccountingError, UsageError
from draftdeck.fileio import atomic_output, sha256_file
from draftdeck.formats.model import Conversation
from draftdeck.progress import Progress
from draftdeck.quality import Report
from draftdeck.shards.stats import Stats
from draftdeck.shards.store import Block, ShardInfo, is_multimodal, schema, write_block
from draftdeck.tokenize import pipeline, rows, vision
from draftdeck.tokenize.options import TokenizeOptions
from draftdeck.tokenize.pipeline import EncoderMismatch, Item, to_item
from draftdeck.tokenize.report_state import report_from_state, report_state

PLAN = "plan.json"
FALLBACK = "encoder-fallback"  # present once a chunk found the fast encoder wrong: HF from then on


class RerunChunks(Exception):
    """The final step needs these chunks run again (on the HF tokenizer) before it can finish."""

    def __init__(self, indexes: list[int], reason: str):
        super().__init__(f"chunks {indexes} must run again: {reason}")
        self.indexes = indexes
        self.reason = reason


def input_name(index: int) -> str:
    return f"input-{index:05d}.jsonl"


def shard_name(index: int) -> str:
    return f"chunk-{index:05d}.arrow"


def stats_name(index: int) -> str:
    return f"stats-{index:05d}.npz"


# -- 1. plan --------------------------------------------------------------------------------------
@dataclass
class ChunkInput:
    index: int
    path: str
    conversations: int


@dataclass
class Plan:
    read_report: Report
    chunks: list[ChunkInput]

    def to_dict(self) -> dict[str, Any]:
        return {"read_report": report_state(self.read_report),
                "chunks": [c.__dict__ for c in self.chunks]}  # fmt: skip

    @classmethod
    def load(cls, parts_dir: Path) -> Plan:
        data = json.loads((parts_dir / PLAN).read_text(encoding="utf-8"))
        return cls(report_from_state(data["read_report"]), [ChunkInput(**c) for c in data["chunks"]])


def plan_chunks(source: Callable[[Report], Iterable[Conversation]], parts_dir: Path, chunk_rows: int) -> Plan:
    """Read every conversation of `source(report)` once, in order, into chunk files in `parts_dir`."""
    if chunk_rows < 1:
        raise UsageError("chunk_rows must be at least 1")
    parts_dir.mkdir(parents=True, exist_ok=True)
    read_report = Report()
    chunks: list[ChunkInput] = []
    files = _ChunkFiles(parts_dir)
    try:
        for conv in source(read_report):
            if not chunks or files.count == chunk_rows:
                chunks.append(files.start(len(chunks)))
            files.add(to_item(conv))
        if not chunks:
            chunks.append(files.start(0))
        files.finish()
    except BaseException:
        files.abort()
        raise
    for c, count in zip(chunks, files.counts, strict=True):
        c.conversations = count
    plan = Plan(read_report, chunks)
    with atomic_output(parts_dir / PLAN, "w") as f:
        json.dump(plan.to_dict(), f, ensure_ascii=False)
    return plan


class _ChunkFiles:
    """Writes chunk files one after the other, each atomically (temporary name, fsync, rename)."""

    def __init__(self, parts_dir: Path):
        self.parts_dir = parts_dir
        self.count = 0
        self.counts: list[int] = []
        self._ctx: Any = None
        self._f: IO[bytes] | None = None

    def start(self, index: int) -> ChunkInput:
        self.finish()
        path = self.parts_dir / input_name(index)
        self._ctx = atomic_output(path)
        self._f = self._ctx.__enter__()
        self.count = 0
        return ChunkInput(index, str(path), 0)

    def add(self, item: Item) -> None:
        assert self._f is not None
        self._f.write(item_line(item))
        self.count += 1

    def finish(self) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self.counts.append(self.count)
            self._ctx = self._f = None

    def abort(self) -> None:
        if self._ctx is not None:
            with contextlib.suppress(RuntimeError):
                self._ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)
            self._ctx = self._f = None


_ITEM_FIELDS = tuple(Item.__dataclass_fields__)
_TUPLES = ("warnings", "untrained")


def item_line(item: Item) -> bytes:
    """One Item as a JSON line (its answer ids' message indexes become keys of text)."""
    try:
        return orjson.dumps(
            [getattr(item, name) for name in _ITEM_FIELDS],
            option=orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE,
        )
    except orjson.JSONEncodeError as exc:
        raise UsageError(f"{item.file}, row {item.row}: a value that JSON cannot hold ({exc})") from None


def read_items(path: Path) -> Iterator[Item]:
    """The Items of a chunk file; a line that is not one is refused, naming the file and the line."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                values = dict(zip(_ITEM_FIELDS, orjson.loads(line), strict=True))
                for name in _TUPLES:
                    values[name] = tuple(values[name])
                values["answer_ids"] = {int(k): v for k, v in values["answer_ids"].items()}
                yield Item(**values)
            except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
                raise UsageError(f"{path}, line {n}: not a chunk file's conversation ({exc})") from None


# -- 2. one chunk ---------------------------------------------------------------------------------
@dataclass
class ChunkOutcome:
    """What one chunk produced: its report, its shard (None when every row was rejected), its stats."""

    index: int
    report: Report
    shard: ShardInfo | None
    stats_path: str
    encoder: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0  # in its shard: the service shows tokens/s while the job runs

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "tokens": self.tokens,
            "report": report_state(self.report),
            "shard": self.shard.to_dict() if self.shard else None,
            "stats_path": self.stats_path,
            "encoder": self.encoder,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChunkOutcome:
        shard = ShardInfo(**d["shard"]) if d.get("shard") else None
        return cls(d["index"], report_from_state(d["report"]), shard, d["stats_path"], d.get("encoder") or {},
                   int(d.get("tokens") or 0))  # fmt: skip


def tokenize_chunk(
    items_path: Path,
    index: int,
    out_dir: Path,
    parts_dir: Path,
    opts: TokenizeOptions,
    progress: Progress | None = None,
) -> ChunkOutcome:
    """Tokenize the conversations of one chunk file into ONE shard ``out_dir/chunk-<index>.arrow``.

    Writing is atomic and idempotent: running a chunk again replaces its shard and statistics.
    `progress(rows_done, rows_total, "rows")` is called after each batch and may raise Cancelled.
    """
    opts.check()
    got, renderer, fresh = pipeline.load_for(opts)
    tok, hf, fast, note = got.tok, got.hf, got.fast, got.note
    if fast is not None and (parts_dir / FALLBACK).exists():
        fast, note = None, "another chunk found tiktoken disagreeing with the HF tokenizer"
    items = list(read_items(items_path))
    mismatch = 0
    try:
        blocks, report, counts, files = _run(items, rows.State(opts, tok, renderer, hf, fast), progress)
    except EncoderMismatch as exc:
        mismatch = exc.rows
        note = f"tiktoken disagreed with the HF tokenizer ({exc}); the job ran again on the HF tokenizer"
        with atomic_output(parts_dir / FALLBACK, "w") as f:
            f.write(note)
        fast = None
        blocks, report, counts, files = _run(items, rows.State(opts, tok, renderer, hf, None), progress)
    block = Block.concat(blocks) if blocks else Block.from_rows([])
    shard = None
    if len(block):  # the folder is made only for a shard: a job whose every row is rejected makes none
        out_dir.mkdir(parents=True, exist_ok=True)
        vision.store_files(out_dir, files)  # into the dataset folder itself: the final step keeps them
        multimodal = block.images is not None
        shard = write_block(out_dir / shard_name(index), block, schema(multimodal) if multimodal else None)
    else:
        (out_dir / shard_name(index)).unlink(missing_ok=True)
    stats = Stats(len(tok))
    stats.add_block(block)
    stats_path = parts_dir / stats_name(index)
    stats.save_state(stats_path)
    used = "tiktoken" if fast is not None and not mismatch else "hf"
    encoder = {"used": used, "note": note, "mismatch_rows": mismatch, **counts,
               **pipeline.load_facts(got, fresh)}  # fmt: skip
    return ChunkOutcome(index, report, shard, str(stats_path), encoder, stats.tokens)


def _run(
    items: list[Item], st: rows.State, progress: Progress | None
) -> tuple[list[Block], Report, dict[str, int], dict[str, bytes]]:
    rows.use(st)
    report = Report()
    blocks: list[Block] = []
    files: dict[str, bytes] = {}  # the kept rows' images, by stored name
    counts = {"fast_rows": 0, "hf_rows": 0, "verified_rows": 0}
    size = max(1, st.opts.chunk_size)
    for k, start in enumerate(range(0, len(items), size)):
        res = rows.process_chunk(items[start : start + size], first_chunk=k == 0)
        report.merge(res.report)
        counts["fast_rows"] += res.fast_rows
        counts["hf_rows"] += res.hf_rows
        counts["verified_rows"] += res.verified
        if len(res.block):
            blocks.append(res.block)
        files.update(res.image_files)
        if progress is not None:
            progress(min(start + size, len(items)), len(items), "rows")
    return blocks, report, counts, files


# -- 3. finish ------------------------------------------------------------------------------------
def finish_chunks(
    out_dir: Path,
    opts: TokenizeOptions,
    plan: Plan,
    outcomes: list[ChunkOutcome],
    *,
    seconds: float,
    inputs: list[str] | None = None,
) -> Report:
    """Check and merge the chunks of `plan`, then write the dataset (or raise JobFailed).

    Raises :class:`RerunChunks` when a chunk found the fast encoder wrong and others used it."""
    outcomes = sorted(outcomes, key=lambda o: o.index)
    if [o.index for o in outcomes] != [c.index for c in plan.chunks]:
        raise AccountingError(
            f"chunks {[o.index for o in outcomes]} finished, but the plan has {len(plan.chunks)} chunks"
        )
    fallback = parts_dir_of(plan) / FALLBACK
    if fallback.exists():
        fast = [o.index for o in outcomes if o.encoder.get("used") == "tiktoken"]
        if fast:
            raise RerunChunks(fast, fallback.read_text(encoding="utf-8"))
    tok_report = Report()
    tok, *_ = pipeline._load(opts)
    stats = Stats(len(tok))
    mismatch = 0
    notes: list[str] = []
    counts: dict[str, float] = {"fast_rows": 0, "hf_rows": 0, "verified_rows": 0, "tokenizer_loads": 0,
                                "tokenizer_load_seconds": 0.0}  # fmt: skip
    for chunk, o in zip(plan.chunks, outcomes, strict=True):
        if o.report.rows_in != chunk.conversations:
            raise AccountingError(
                f"chunk {o.index} tokenized {o.report.rows_in} conversations; "
                f"it was given {chunk.conversations}"
            )
        rows = o.shard.rows if o.shard else 0
        if rows != o.report.rows_out:
            raise AccountingError(
                f"chunk {o.index}: shard holds {rows} rows, its report says {o.report.rows_out}"
            )
        if o.shard is not None:
            size = (out_dir / o.shard.filename).stat().st_size
            if size != o.shard.bytes:
                raise AccountingError(
                    f"chunk {o.index}: {o.shard.filename} is {size} bytes, not {o.shard.bytes}"
                )
        tok_report.merge(o.report)
        stats.merge(Stats.load_state(Path(o.stats_path)))
        mismatch += int(o.encoder.get("mismatch_rows", 0))
        for key in counts:
            counts[key] += o.encoder.get(key, 0)
        if o.encoder.get("note") and o.encoder["note"] not in notes:
            notes.append(o.encoder["note"])
    used = sorted({str(o.encoder.get("used", "hf")) for o in outcomes})
    note = fallback.read_text(encoding="utf-8") if fallback.exists() else "; ".join(notes)
    if mismatch:
        tok_report.warn("encoder_mismatch", "(encoder)", None, note, n=mismatch)
    counts["tokenizer_load_seconds"] = round(counts["tokenizer_load_seconds"], 3)  # summed over chunk tasks
    encoder = {"used": "+".join(used), "note": note, **counts, "chunks": len(outcomes)}
    shards = [o.shard for o in outcomes if o.shard is not None]

    def close() -> list[ShardInfo]:
        cut = all(s.rows == opts.shard_rows for s in shards[:-1]) and all(
            s.rows <= opts.shard_rows for s in shards
        )
        # chunks with images and chunks without: recut, which gives every shard the image columns
        cut = cut and len({_multimodal(out_dir / s.filename) for s in shards}) <= 1
        if cut:  # already cut as shard_rows asks: rename
            n = len(shards)
            final: list[ShardInfo] = []
            for i, s in enumerate(shards):
                name = f"data-{i:05d}-of-{n:05d}.arrow"
                os.replace(out_dir / s.filename, out_dir / name)
                final.append(ShardInfo(name, s.rows, s.bytes, s.sha256))
            return final
        return recut(out_dir, shards, opts.shard_rows)

    def discard() -> None:
        for s in shards:
            (out_dir / s.filename).unlink(missing_ok=True)
        vision.remove_images(out_dir)
        pipeline.remove_if_empty(out_dir)

    return pipeline.conclude(out_dir, opts, plan.read_report, tok_report, stats, encoder, seconds=seconds,
                             inputs=inputs, close=close, discard=discard)  # fmt: skip


def recut(out_dir: Path, shards: list[ShardInfo], shard_rows: int) -> list[ShardInfo]:
    """Rewrite the chunk shards `shards` (in order) as shards of `shard_rows` OUTPUT rows each (the last
    one shorter), as the in-process run cuts them: a chunk holds `chunk_rows` conversations, which
    become more rows where a template splits turns, or fewer where rows are rejected. One sequential
    pass over memory-mapped shards, whatever their columns; the chunk shards are removed only once
    every new shard is written, so a final step that dies can run again."""
    names = [s.filename for s in shards]
    want = schema(any(_multimodal(out_dir / name) for name in names))
    n = max(1, -(-sum(s.rows for s in shards) // shard_rows))
    final: list[ShardInfo] = []
    pending: list[pa.Table] = []
    held = 0

    def write(table: pa.Table) -> None:
        path = out_dir / f"data-{len(final):05d}-of-{n:05d}.arrow"
        batch = table.combine_chunks().to_batches()  # one record batch per shard, as write_block writes
        with atomic_output(path) as f, pa.ipc.new_stream(f, table.schema) as w:
            for b in batch:
                w.write_batch(b)
        final.append(ShardInfo(path.name, table.num_rows, path.stat().st_size, sha256_file(path)))

    for name in names:
        with pa.memory_map(str(out_dir / name)) as src:
            table = _conformed(pa.ipc.open_stream(src).read_all(), want)
        pending.append(table)
        held += table.num_rows
        while held >= shard_rows:
            whole = pa.concat_tables(pending)
            write(whole.slice(0, shard_rows))
            rest = whole.slice(shard_rows)
            pending, held = ([rest] if rest.num_rows else []), rest.num_rows
    if held:
        write(pa.concat_tables(pending))
    for name in names:
        (out_dir / name).unlink(missing_ok=True)
    return final


def _multimodal(path: Path) -> bool:
    with pa.memory_map(str(path), "r") as src:
        return is_multimodal(pa.ipc.open_stream(src).schema)


def _conformed(table: pa.Table, want: pa.Schema) -> pa.Table:
    """`table` with the columns of `want` (today's shards, with the image columns when a chunk has
    images) that it lacks (a chunk reused from an attempt written before a column was added, e.g.
    ``mix_source``; a chunk of text rows in a dataset with images) filled as such shards read: "", no
    codes, no images. The shards of one dataset then share one schema."""
    if table.schema.names == want.names:
        return table
    n = table.num_rows
    columns = []
    for f in want:
        if f.name in table.schema.names:
            columns.append(table.column(f.name))
        elif pa.types.is_string(f.type):
            columns.append(pa.array([""] * n, f.type))
        elif pa.types.is_list(f.type):
            columns.append(pa.array([[]] * n, f.type))
        else:
            raise AccountingError(f"a reused chunk lacks the column {f.name!r}; tokenize again without reuse")
    return pa.Table.from_arrays(columns, schema=want)


def parts_dir_of(plan: Plan) -> Path:
    return Path(plan.chunks[0].path).parent


def check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"output folder {out_dir} is not empty; choose a new folder")


def tokenize_files_chunked(
    paths: list[Path],
    out_dir: Path,
    parts_dir: Path,
    opts: TokenizeOptions,
    chunk_rows: int,
    *,
    order: Callable[[list[ChunkInput]], list[ChunkInput]] = lambda chunks: chunks,
) -> Report:
    """The chunked run in this process, chunks in `order` (tests; the job runs chunks as tasks)."""
    from draftdeck.tokenize.inputs import read_inputs

    opts.check()
    check_out_dir(out_dir)
    started = time.monotonic()
    plan = plan_chunks(
        lambda r: read_inputs(paths, r, **opts.reading()),
        parts_dir,
        chunk_rows,
    )
    done = {
        c.index: tokenize_chunk(Path(c.path), c.index, out_dir, parts_dir, opts) for c in order(plan.chunks)
    }
    while True:
        try:
            return finish_chunks(out_dir, opts, plan, list(done.values()), seconds=time.monotonic() - started,
                                 inputs=[str(p) for p in paths])  # fmt: skip
        except RerunChunks as again:
            for i in again.indexes:
                done[i] = tokenize_chunk(Path(plan.chunks[i].path), i, out_dir, parts_dir, opts)
