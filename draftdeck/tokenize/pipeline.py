"""The tokenize job: conversations in, Arrow shards with exact assistant loss masks out.

Per conversation: render (see :mod:`draftdeck.chat.spans`: assistant spans, split rows when the
template is not prefix-stable), encode ONCE with offsets (batched per chunk), mask, check.

Mask rule: a token is trained iff its first character lies inside an assistant span. A token that
straddles the start of a span (e.g. the ``\\n\\n`` that merges the generation prompt's ``<think>\\n``
with the first ``\\n`` of an empty think block) begins in the prompt, so it is not trained: no
trained token ever holds a character of the prompt. HF's ``return_assistant_tokens_mask`` marks
every token that overlaps a span instead; the two agree wherever span edges fall on token edges.

Per-row checks (issue codes in :mod:`draftdeck.quality`):

- ``mask_mismatch``: the decoded ids of each trained run differ from the rendered text those tokens
  cover (ids and offsets disagree: an encoder or offset bug). Fails the job.
- ``no_trained_tokens`` (rejected), ``truncated`` (warned; ``too_long`` rejects with
  ``truncation="drop"``), ``no_dflash_anchor`` (warned: no two consecutive trained tokens),
  ``template_error`` (rejected with the template's message), ``no_assistant_turn``
  (``on_missing="error"`` fails the job pointing to regeneration; ``"drop"`` rejects the rows).

Speed: chunks of conversations go to a process pool (one process per core, forked so the tokenizer
is loaded once); the main process writes shards and statistics. The fast encoder (tiktoken) is
checked against the HF tokenizer on a sample of rows (all rows of the first chunk, then one row in
``verify_every``; every row with ``verify_all``): any mismatch discards the output and runs the job
again on the HF encoder, with ``encoder_mismatch`` in the report.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from draftdeck.chat.render import ChatRenderer, tokenizer_fingerprint
from draftdeck.errors import JobFailed, UsageError
from draftdeck.formats.model import Conversation
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Output, Report
from draftdeck.shards.manifest import MANIFEST, Manifest, ShardInfo, TokenizerRef
from draftdeck.shards.stats import Stats
from draftdeck.shards.store import ShardWriter, write_metadata
from draftdeck.tokenize import loaded, rows, vision
from draftdeck.tokenize.encoders import HFEncoder, TiktokenEncoder
from draftdeck.tokenize.options import TokenizeOptions
from draftdeck.tokenize.rows import ChunkResult, EncoderMismatch, Item, process_chunk, to_item

MASK_RULE = "a token is trained iff its first character lies inside an assistant span"


# -- main side ------------------------------------------------------------------------------------
def load_for(opts: TokenizeOptions) -> tuple[loaded.LoadedTokenizer, ChatRenderer, bool]:
    """The tokenizer and encoders for `opts` (kept by this process across jobs: see
    :mod:`draftdeck.tokenize.loaded`), this job's renderer, and whether this call loaded them."""
    import json

    got, fresh = loaded.load(opts.tokenizer, opts.chat_template, opts.encoder)
    json.dumps(opts.template_kwargs)  # template kwargs must be plain JSON (they go into the manifest)
    return got, ChatRenderer.from_tokenizer(got.tok, opts.template_kwargs), fresh


def _load(opts: TokenizeOptions) -> tuple[Any, ChatRenderer, HFEncoder, TiktokenEncoder | None, str]:
    """Tokenizer, renderer, encoders and the encoder note for `opts` (see :func:`load_for`)."""
    got, renderer, _ = load_for(opts)
    return got.tok, renderer, got.hf, got.fast, got.note


def load_facts(got: loaded.LoadedTokenizer, fresh: bool) -> dict[str, Any]:
    """What the report says about the tokenizer's load: whether this run loaded it, and how long that took."""
    return {"tokenizer_loads": int(fresh), "tokenizer_load_seconds": round(got.seconds, 3) if fresh else 0.0}


def tokenize_rows(convs: list[Conversation], opts: TokenizeOptions) -> ChunkResult:
    """Render, encode, mask and check conversations in memory (no shards): for tests and previews.
    Every row is checked against the HF tokenizer when the fast encoder is used."""
    opts.check()
    tok, renderer, hf, fast, _ = _load(opts)
    rows.use(rows.State(opts, tok, renderer, hf, fast))
    return process_chunk([to_item(c) for c in convs], first_chunk=True)


def _chunks(it: Iterable[Conversation], size: int) -> Iterator[tuple[int, list[Item]]]:
    iterator = iter(it)
    i = 0
    while chunk := [to_item(c) for c in islice(iterator, size)]:
        yield i, chunk
        i += 1


def _bounded(pool: Any, chunks: Iterator[tuple[int, list[Item]]], window: int) -> Iterator[ChunkResult]:
    """Results in order, with at most `window` chunks in flight: the input is read as fast as it is
    processed, never ahead into memory, and in this thread (progress and cancellation stay here)."""
    pending: deque[Any] = deque()
    for item in chunks:
        pending.append(pool.apply_async(rows.process_indexed, (item,)))
        if len(pending) >= window:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def combine(read: Report, tok: Report) -> Report:
    """The job's report: the reading stage's rows in, the tokenize stage's rows out."""
    if read.rows_in == 0 and read.rows_out == 0 and not read.rejected:
        return tok
    final = Report()
    final.merge(read)
    final.merge(tok)
    final.rows_in = read.rows_in
    final.rows_out = tok.rows_out
    final.outputs = list(tok.outputs)
    return final


def _workers(opts: TokenizeOptions) -> int:
    n = opts.workers or (os.cpu_count() or 1)
    if mp.current_process().daemon:  # e.g. inside a Celery prefork child: no children allowed
        return 1
    return max(1, n)


def _attempt(
    source: Callable[[Report], Iterable[Conversation]],
    out_dir: Path,
    st: rows.State,
    progress: Progress | None,
) -> tuple[Report, Report, ShardWriter, Stats, dict[str, int]]:
    rows.use(st)
    read_report = Report()
    tok_report = Report()
    writer = ShardWriter(out_dir, st.opts.shard_rows)
    stats = Stats(len(st.tok))
    counts = {"fast_rows": 0, "hf_rows": 0, "verified_rows": 0}
    chunks = _chunks(source(read_report), st.opts.chunk_size)
    workers = _workers(st.opts)
    pool = None
    try:
        if workers > 1:  # a pool only when there is more than one chunk: starting one costs more than a chunk
            first = list(islice(chunks, 2))
            chunks = itertools.chain(first, chunks)
            workers = workers if len(first) > 1 else 1
        if workers > 1:
            pool = mp.get_context("fork").Pool(workers)
            results: Iterable[ChunkResult] = _bounded(pool, chunks, 2 * workers)
        else:
            results = (rows.process_indexed(c) for c in chunks)
        for res in results:
            tok_report.merge(res.report)
            counts["fast_rows"] += res.fast_rows
            counts["hf_rows"] += res.hf_rows
            counts["verified_rows"] += res.verified
            writer.add_block(res.block)
            vision.store_files(out_dir, res.image_files)
            stats.add_block(res.block)
            if progress is not None:
                progress(tok_report.rows_in, None, "rows")
    except BaseException:
        writer.discard()
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    return read_report, tok_report, writer, stats, counts


def tokenize(
    source: Callable[[Report], Iterable[Conversation]],
    out_dir: Path,
    opts: TokenizeOptions,
    *,
    progress: Progress | None = no_progress,
    inputs: list[str] | None = None,
) -> Report:
    """Run the tokenize job; return its report or raise :class:`JobFailed` (carrying the report).

    `source(report)` yields the conversations and counts the reading stage into `report`; it is
    called again if the job restarts on the HF encoder. `progress` gets rows done (None: the source
    reports progress itself, e.g. in bytes).
    """
    opts.check()
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"output folder {out_dir} is not empty; choose a new folder")
    try:
        return _tokenize(source, out_dir, opts, progress, inputs)
    except BaseException:
        vision.remove_images(out_dir)
        remove_if_empty(out_dir)  # a failed job leaves no output, not even an empty folder
        raise


def remove_if_empty(folder: Path) -> None:
    """Remove `folder` if it exists and holds nothing (what a failed run leaves after its discard)."""
    with contextlib.suppress(OSError):
        folder.rmdir()


def _tokenize(
    source: Callable[[Report], Iterable[Conversation]],
    out_dir: Path,
    opts: TokenizeOptions,
    progress: Progress | None,
    inputs: list[str] | None,
) -> Report:
    started = time.monotonic()
    got, renderer, fresh = load_for(opts)
    tok, hf, fast, encoder_note = got.tok, got.hf, got.fast, got.note
    mismatch: EncoderMismatch | None = None
    try:
        read_report, tok_report, writer, stats, counts = _attempt(
            source, out_dir, rows.State(opts, tok, renderer, hf, fast), progress
        )
    except EncoderMismatch as exc:
        mismatch = exc
        encoder_note = (
            f"tiktoken disagreed with the HF tokenizer ({exc}); the job ran again on the HF tokenizer"
        )
        read_report, tok_report, writer, stats, counts = _attempt(
            source, out_dir, rows.State(opts, tok, renderer, hf, None), progress
        )
    if mismatch is not None:
        tok_report.warn("encoder_mismatch", "(encoder)", None, encoder_note, n=mismatch.rows)
    encoder = {"used": "tiktoken" if fast is not None and mismatch is None else "hf", "note": encoder_note,
               **counts, **load_facts(got, fresh)}  # fmt: skip
    return conclude(
        out_dir, opts, read_report, tok_report, stats, encoder,
        seconds=time.monotonic() - started, inputs=inputs, close=writer.close, discard=writer.discard,
    )  # fmt: skip


def conclude(
    out_dir: Path,
    opts: TokenizeOptions,
    read_report: Report,
    tok_report: Report,
    stats: Stats,
    encoder: dict[str, Any],
    *,
    seconds: float,
    inputs: list[str] | None,
    close: Callable[[], list[ShardInfo]],
    discard: Callable[[], None],
) -> Report:
    """The end of a tokenize run, shared by the in-process run and the chunked one: the job's report,
    the policy (``discard()`` the shards and raise :class:`JobFailed`), else ``close()`` the shards
    (their final names), the statistics and the manifest."""
    tok, renderer, _, _, _ = _load(opts)
    report = combine(read_report, tok_report)
    report.extra["encoder"] = encoder
    report.extra["mask_rule"] = MASK_RULE
    report.extra["tokens"] = stats.tokens
    report.extra["trained_tokens"] = stats.trained
    report.extra["seconds"] = round(seconds, 3)

    policy = opts.policy()
    report.extra["losses"] = policy.losses(report)
    failures = policy.failures(report)
    missing = report.rejected.get("no_assistant_turn", 0)
    if missing and opts.on_missing == "error":
        discard()
        raise JobFailed(
            f"{missing} conversations have no assistant turn (prompt-only). Drafters train on the target "
            "model's own answers: generate the responses with the target model first (regeneration), or pass "
            "--on-missing drop to leave these rows out.",
            report,
        )
    if failures:
        discard()
        raise JobFailed("; ".join(f.reason for f in failures), report)

    shards = close()
    report.outputs = [Output(str(out_dir / s.filename), s.rows, s.bytes, s.sha256) for s in shards]
    report.check_accounting()
    stats.write(out_dir)
    write_metadata(
        out_dir,
        Manifest(
            shards=shards,
            tokenizer=TokenizerRef(
                path=str(Path(opts.tokenizer).resolve()),  # as typed, it means nothing from another folder
                fingerprint=tokenizer_fingerprint(opts.tokenizer, renderer.template, opts.template_kwargs),
                vocab_size=len(tok),
                chat_template=renderer.template,
            ),
            inputs=inputs or [],
            parameters=opts.to_dict(),
            mask_rule=MASK_RULE,
            report=report.to_dict(),
            provenance=stats.provenance,
            images=vision.finalize(out_dir, shards),
        ),
    )
    return report


def tokenize_conversations(
    convs: list[Conversation], out_dir: Path, opts: TokenizeOptions, progress: Progress = no_progress
) -> Report:
    """Tokenize conversations already in memory (tests, notebooks)."""
    return tokenize(lambda _report: iter(convs), out_dir, opts, progress=progress)


def tokenize_files(
    paths: list[Path], out_dir: Path, opts: TokenizeOptions, progress: Progress = no_progress
) -> Report:
    from draftdeck.tokenize.inputs import read_inputs

    return tokenize(
        lambda report: read_inputs(paths, report, progress, **opts.reading()),
        out_dir,
        opts,
        progress=None,
        inputs=[str(p) for p in paths],
    )


__all__ = [
    "MANIFEST",
    "ChunkResult",
    "EncoderMismatch",
    "Item",
    "TokenizeOptions",
    "process_chunk",
    "to_item",
    "tokenize",
    "tokenize_conversations",
    "tokenize_files",
]
