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

import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import numpy as np

from draftdeck.chat.render import (
    ChatRenderer,
    TemplateError,
    conversation_dicts,
    load_tokenizer,
    tokenizer_fingerprint,
)
from draftdeck.chat.spans import RenderedRow, render_rows
from draftdeck.errors import JobFailed, UsageError
from draftdeck.formats.model import Conversation
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import LOSSES, Output, Policy, Report
from draftdeck.shards.manifest import MANIFEST, Manifest, ShardInfo, TokenizerRef
from draftdeck.shards.stats import Stats
from draftdeck.shards.store import Block, ShardRow, ShardWriter, write_metadata
from draftdeck.tokenize.encoders import Encoded, EncoderUnsupported, HFEncoder, TiktokenEncoder

MASK_RULE = "a token is trained iff its first character lies inside an assistant span"


@dataclass
class TokenizeOptions:
    tokenizer: Path
    chat_template: Path | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    seq_length: int | None = None
    truncation: Literal["right", "drop"] = "right"
    on_missing: Literal["error", "drop"] = "error"
    shard_rows: int = 10_000
    verify_all: bool = False
    verify_every: int = 32
    strict: bool = False
    max_rejected: float | None = None  # fail past this share of rejected rows (the job's default: 0.5)
    alert_rejected: float | None = None  # alert thresholds (draftdeck.quality.LOSSES)
    alert_duplicated: float | None = None
    alert_truncated: float | None = None
    encoder: Literal["auto", "hf", "tiktoken"] = "auto"
    from_format: str | None = None  # one input shape every row must have (draftdeck.formats.detect)
    workers: int = 0  # 0: one per CPU core
    chunk_size: int = 256

    def check(self) -> None:
        if self.seq_length is not None and self.seq_length < 2:
            raise UsageError("--seq-length must be at least 2")
        if self.truncation not in ("right", "drop"):
            raise UsageError(f"--truncation must be right or drop, not {self.truncation!r}")
        if self.on_missing not in ("error", "drop"):
            raise UsageError(f"--on-missing must be error or drop, not {self.on_missing!r}")
        if self.shard_rows < 1:
            raise UsageError("--shard-rows must be at least 1")
        if self.encoder not in ("auto", "hf", "tiktoken"):
            raise UsageError(f"encoder must be auto, hf or tiktoken, not {self.encoder!r}")

    def policy(self) -> Policy:
        """The job's verdict on the finished report: strict, the rejected share, the alert shares."""
        alerts = {k: getattr(self, k) for k in LOSSES}
        return Policy.build(None, self.strict, self.max_rejected, **alerts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tokenizer"] = str(self.tokenizer)
        d["chat_template"] = str(self.chat_template) if self.chat_template else None
        return d


class EncoderMismatch(Exception):
    def __init__(self, rows: int, example: str):
        super().__init__(f"{rows} rows differ from the HF tokenizer, e.g. {example}")
        self.rows = rows
        self.example = example

    def __reduce__(self) -> tuple[Any, ...]:  # raised in pool workers: must survive pickling
        return (EncoderMismatch, (self.rows, self.example))


# -- worker side ----------------------------------------------------------------------------------
@dataclass
class _State:
    opts: TokenizeOptions
    tok: Any
    renderer: ChatRenderer
    hf: HFEncoder
    fast: TiktokenEncoder | None


_STATE: _State | None = None


@dataclass
class ChunkResult:
    report: Report
    block: Block
    fast_rows: int = 0
    hf_rows: int = 0
    verified: int = 0

    @property
    def rows(self) -> list[ShardRow]:
        b, off, issues = self.block, self.block.offsets, self.block.row_issues()
        return [
            ShardRow(b.ids[off[i] : off[i + 1]], b.masks[off[i] : off[i + 1]], b.sources[i], b.source_rows[i],
                     b.turns[i], b.truncated[i], issues[i])
            for i in range(len(b))
        ]  # fmt: skip


@dataclass(slots=True)
class Item:
    """One conversation as workers get it: template-ready dicts (cheap to pickle) and where it came from."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    file: str
    line: int | None
    row: int
    has_assistant: bool
    # The original data (a converted row's provenance): what the shards' source/source_row record.
    origin_file: str | None = None
    origin_row: int = -1
    warnings: tuple[str, ...] = ()  # the conversation's warning codes from convert's checks


def to_item(conv: Conversation) -> Item:
    src = conv.source
    line = None if src is None else (src.line if src.line is not None else src.index)
    origin = conv.origin()
    return Item(conversation_dicts(conv), conv.tools, src.file if src else "(memory)", line,
                line if line is not None else -1, conv.has_assistant,
                origin[0] if origin else None, origin[1] if origin else -1, tuple(conv.warnings))  # fmt: skip


def _encode(
    st: _State, rendered: list[RenderedRow], first_chunk: bool
) -> tuple[list[Encoded], set[int], int, int]:
    out: list[Encoded | None] = [None] * len(rendered)
    hf_idx: list[int] = []
    fast_set: set[int] = set()
    verified = 0
    mismatches: list[str] = []
    cache: dict[str, np.ndarray] = {}  # text between special tokens -> ids, for this chunk
    for i, r in enumerate(rendered):
        if st.fast is not None and st.fast.usable(r.text):
            out[i] = st.fast.encode_one(r.text, r.literal, cache)
            fast_set.add(i)
        else:
            hf_idx.append(i)
    if hf_idx:
        encs = st.hf.encode([rendered[i].text for i in hf_idx], [rendered[i].literal for i in hf_idx])
        for i, e in zip(hf_idx, encs, strict=True):
            out[i] = e
    if st.fast is not None and fast_set:
        every = 1 if (st.opts.verify_all or first_chunk) else max(1, st.opts.verify_every)
        check = [i for i in sorted(fast_set) if i % every == 0]
        refs = st.hf.encode([rendered[i].text for i in check], [rendered[i].literal for i in check])
        for i, (ids, starts) in zip(check, refs, strict=True):
            got = out[i]
            assert got is not None
            verified += 1
            if not (np.array_equal(got[0], ids) and np.array_equal(got[1], starts)):
                mismatches.append(repr(rendered[i].text[:80]))
        if mismatches:
            raise EncoderMismatch(len(mismatches), mismatches[0])
    return out, fast_set, len(hf_idx), verified  # type: ignore[return-value]


def _mask(starts: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    bounds = np.asarray([x for span in spans for x in span], dtype=np.int64)
    return (np.searchsorted(bounds, starts, side="right") % 2 == 1).astype(np.uint8)


def _runs(r: RenderedRow, ids: np.ndarray, starts: np.ndarray) -> Iterator[tuple[int, int, str]]:
    """The trained runs of a row: (first token, end token, the rendered text those tokens cover)."""
    if not r.spans:
        return
    n = len(ids)
    bounds = np.searchsorted(starts, np.asarray(r.spans, dtype=np.int64).ravel(), side="left").tolist()
    for lo, hi in zip(bounds[::2], bounds[1::2], strict=True):
        if lo < hi:
            end = int(starts[hi]) if hi < n else len(r.text)
            yield lo, hi, r.text[int(starts[lo]) : end]


def _check_runs(
    st: _State, rendered: list[RenderedRow], encoded: list[Encoded], fast_set: set[int]
) -> dict[int, str]:
    """Rows whose trained runs do not decode to the rendered text they cover -> the first reason.

    Rows of the fast (byte-level) encoder decode through its byte table: the bytes of all of them are
    laid out once (the byte-level decoder: concatenate the tokens' bytes) and each run is a slice of
    them. The other rows decode through the HF tokenizer's decoder, in one batch."""
    bad_rows: dict[int, str] = {}
    hf_runs: list[tuple[int, np.ndarray, str]] = []
    fast_rows = [k for k in range(len(rendered)) if k in fast_set]
    for k, (r, (ids, starts)) in enumerate(zip(rendered, encoded, strict=True)):
        if k not in fast_set:
            hf_runs.extend((k, ids[lo:hi], want) for lo, hi, want in _runs(r, ids, starts))
    if hf_runs:
        decoded = st.hf.backend.decode_batch(
            [ids.tolist() for _, ids, _ in hf_runs], skip_special_tokens=False
        )
        norm = st.hf.normalizer
        for (k, _, want), got in zip(hf_runs, decoded, strict=True):
            if got != want and (norm is None or got != norm.normalize_str(want)):
                bad_rows.setdefault(k, f"decoded {got[:60]!r} but the rendered text is {want[:60]!r}")
    if st.fast is not None and fast_rows:
        all_ids = np.concatenate([encoded[k][0] for k in fast_rows])
        blob = st.fast.decode_bytes(all_ids)
        byte_at = np.zeros(len(all_ids) + 1, dtype=np.int64)  # byte offset of every token in `blob`
        np.cumsum(st.fast.token_len[all_ids], out=byte_at[1:])
        base = 0
        for k in fast_rows:
            r, (ids, starts) = rendered[k], encoded[k]
            for lo, hi, want in _runs(r, ids, starts):
                got_bytes = blob[byte_at[base + lo] : byte_at[base + hi]]
                if got_bytes != want.encode("utf-8"):
                    got = got_bytes.decode("utf-8", "replace")
                    bad_rows.setdefault(k, f"decoded {got[:60]!r} but the rendered text is {want[:60]!r}")
            base += len(ids)
    return bad_rows


def process_chunk(items: list[Item], first_chunk: bool = False) -> ChunkResult:
    st = _STATE
    assert st is not None, "worker state not initialised"
    opts = st.opts
    report = Report()
    rendered: list[RenderedRow] = []
    owners: list[Item] = []
    for item in items:
        report.rows_in += 1
        file, line = item.file, item.line
        if not item.has_assistant:
            report.reject(
                "no_assistant_turn", file, line, "no assistant message: the conversation is prompt-only"
            )
            continue
        try:
            rows = render_rows(item.messages, item.tools, st.renderer)
        except TemplateError as exc:
            report.reject("template_error", file, line, str(exc)[:500])
            continue
        report.rows_expanded += len(rows) - 1
        rendered.extend(rows)
        owners.extend([item] * len(rows))

    encoded, fast_set, hf_n, verified = _encode(st, rendered, first_chunk)

    # Masks, then the mask check: every trained run decodes to the rendered text it covers.
    masks = [_mask(starts, r.spans) for r, (_, starts) in zip(rendered, encoded, strict=True)]
    bad_rows = _check_runs(st, rendered, encoded, fast_set)

    keep: list[tuple[np.ndarray, np.ndarray]] = []
    sources: list[str] = []
    source_rows: list[int] = []
    turns: list[int] = []
    truncs: list[bool] = []
    issues: list[list[str]] = []  # per kept row: its warning codes, the sample view's badges
    for k, (r, (ids, _)) in enumerate(zip(rendered, encoded, strict=True)):
        owner = owners[k]
        file, line, row_no = owner.file, owner.line, owner.row
        mask = masks[k]
        if k in bad_rows:
            report.reject("mask_mismatch", file, line, bad_rows[k])
            continue
        truncated = False
        if opts.seq_length is not None and len(ids) > opts.seq_length:
            if opts.truncation == "drop":
                report.reject("too_long", file, line, f"{len(ids)} tokens > --seq-length {opts.seq_length}")
                continue
            ids, mask = ids[: opts.seq_length], mask[: opts.seq_length]
            truncated = True
        if not mask.any():
            why = (
                "after truncation at --seq-length" if truncated else "the assistant turns render to no token"
            )
            report.reject("no_trained_tokens", file, line, why)
            continue
        codes = list(owner.warnings)
        if truncated:
            report.warn("truncated", file, line, f"cut to {opts.seq_length} tokens")
            codes.append("truncated")
        if not (mask[:-1] & mask[1:]).any():
            report.warn("no_dflash_anchor", file, line, "no two consecutive trained tokens")
            codes.append("no_dflash_anchor")
        issues.append(codes)
        report.rows_out += 1
        keep.append((ids, mask))
        sources.append(owner.origin_file or file)
        source_rows.append(owner.origin_row if owner.origin_file else row_no)
        turns.append(r.turn)
        truncs.append(truncated)
    block = Block(
        np.concatenate([i for i, _ in keep]).astype(np.int32) if keep else np.zeros(0, np.int32),
        np.concatenate([m for _, m in keep]).astype(np.uint8) if keep else np.zeros(0, np.uint8),
        np.asarray([len(i) for i, _ in keep], dtype=np.int64),
        sources, source_rows, turns, truncs, issues,
    )  # fmt: skip
    return ChunkResult(report, block, len(fast_set), hf_n, verified)


def _process_indexed(item: tuple[int, list[Item]]) -> ChunkResult:
    return process_chunk(item[1], first_chunk=item[0] == 0)


# -- main side ------------------------------------------------------------------------------------
_LOADED: dict[tuple[str, ...], tuple[Any, HFEncoder, TiktokenEncoder | None, str]] = {}


def _load(opts: TokenizeOptions) -> tuple[Any, ChatRenderer, HFEncoder, TiktokenEncoder | None, str]:
    """Tokenizer, renderer and encoders for `opts`; the last two loads are kept for the process."""
    import json

    tj = Path(opts.tokenizer) / "tokenizer.json"
    key = (str(Path(opts.tokenizer).resolve()), str(tj.stat().st_mtime_ns) if tj.exists() else "",
           str(opts.chat_template), opts.encoder)  # fmt: skip
    if key not in _LOADED:
        tok = load_tokenizer(opts.tokenizer, opts.chat_template)
        fast: TiktokenEncoder | None = None
        note = ""
        if opts.encoder in ("auto", "tiktoken"):
            try:
                fast = TiktokenEncoder(tok)
            except EncoderUnsupported as exc:
                if opts.encoder == "tiktoken":
                    raise UsageError(f"the tiktoken encoder cannot run this tokenizer: {exc}") from exc
                note = f"tiktoken not used: {exc}"
        while len(_LOADED) >= 2:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = (tok, HFEncoder(tok), fast, note)
    tok, hf, fast, note = _LOADED[key]
    json.dumps(opts.template_kwargs)  # template kwargs must be plain JSON (they go into the manifest)
    return tok, ChatRenderer.from_tokenizer(tok, opts.template_kwargs), hf, fast, note


def tokenize_rows(convs: list[Conversation], opts: TokenizeOptions) -> ChunkResult:
    """Render, encode, mask and check conversations in memory (no shards): for tests and previews.
    Every row is checked against the HF tokenizer when the fast encoder is used."""
    global _STATE
    opts.check()
    tok, renderer, hf, fast, _ = _load(opts)
    _STATE = _State(opts, tok, renderer, hf, fast)
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
        pending.append(pool.apply_async(_process_indexed, (item,)))
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
    source: Callable[[Report], Iterable[Conversation]], out_dir: Path, st: _State, progress: Progress | None
) -> tuple[Report, Report, ShardWriter, Stats, dict[str, int]]:
    global _STATE
    _STATE = st
    read_report = Report()
    tok_report = Report()
    writer = ShardWriter(out_dir, st.opts.shard_rows)
    stats = Stats(len(st.tok))
    counts = {"fast_rows": 0, "hf_rows": 0, "verified_rows": 0}
    chunks = _chunks(source(read_report), st.opts.chunk_size)
    workers = _workers(st.opts)
    pool = None
    try:
        if workers > 1:
            pool = mp.get_context("fork").Pool(workers)
            results: Iterable[ChunkResult] = _bounded(pool, chunks, 2 * workers)
        else:
            results = (_process_indexed(c) for c in chunks)
        for res in results:
            tok_report.merge(res.report)
            counts["fast_rows"] += res.fast_rows
            counts["hf_rows"] += res.hf_rows
            counts["verified_rows"] += res.verified
            writer.add_block(res.block)
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
    started = time.monotonic()
    tok, renderer, hf, fast, encoder_note = _load(opts)
    mismatch: EncoderMismatch | None = None
    try:
        read_report, tok_report, writer, stats, counts = _attempt(
            source, out_dir, _State(opts, tok, renderer, hf, fast), progress
        )
    except EncoderMismatch as exc:
        mismatch = exc
        encoder_note = (
            f"tiktoken disagreed with the HF tokenizer ({exc}); the job ran again on the HF tokenizer"
        )
        read_report, tok_report, writer, stats, counts = _attempt(
            source, out_dir, _State(opts, tok, renderer, hf, None), progress
        )
    if mismatch is not None:
        tok_report.warn("encoder_mismatch", "(encoder)", None, encoder_note, n=mismatch.rows)
    encoder = {"used": "tiktoken" if fast is not None and mismatch is None else "hf", "note": encoder_note,
               **counts}  # fmt: skip
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
        lambda report: read_inputs(paths, report, progress, strict=opts.strict, from_format=opts.from_format),
        out_dir,
        opts,
        progress=None,
        inputs=[str(p) for p in paths],
    )


__all__ = [
    "MANIFEST",
    "TokenizeOptions",
    "process_chunk",
    "tokenize",
    "tokenize_conversations",
    "tokenize_files",
]
