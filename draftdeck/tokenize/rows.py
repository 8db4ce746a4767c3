"""One chunk of conversations -> rows: render, encode, mask, check (the tokenize job's per-row work).

This is what runs in each process of the pool (and in each chunk task): :func:`process_chunk` reads
the process's :class:`State` (set by :func:`use` before the pool forks or the chunk starts), so a
chunk sends only its conversations, never the tokenizer. The mask rule and the per-row checks are
described in :mod:`draftdeck.tokenize.pipeline`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from draftdeck.causal_lm import max_positions
from draftdeck.chat.coverage import DROPPED, dropped
from draftdeck.chat.render import ChatRenderer, TemplateError, conversation_dicts
from draftdeck.chat.spans import RenderedRow, render_rows
from draftdeck.formats.common import RowRejected
from draftdeck.formats.model import Conversation
from draftdeck.provenance import answered_by, vocab_fingerprint
from draftdeck.quality import Report
from draftdeck.shards.store import Block, ShardRow
from draftdeck.tokenize import target_ids, vision
from draftdeck.tokenize.encoders import Encoded, HFEncoder, TiktokenEncoder

if TYPE_CHECKING:
    from draftdeck.tokenize.options import TokenizeOptions


class EncoderMismatch(Exception):
    def __init__(self, rows: int, example: str):
        super().__init__(f"{rows} rows differ from the HF tokenizer, e.g. {example}")
        self.rows = rows
        self.example = example

    def __reduce__(self) -> tuple[Any, ...]:  # raised in pool workers: must survive pickling
        return (EncoderMismatch, (self.rows, self.example))


@dataclass
class State:
    opts: TokenizeOptions
    tok: Any
    renderer: ChatRenderer
    hf: HFEncoder
    fast: TiktokenEncoder | None

    @cached_property
    def max_positions(self) -> tuple[int, str] | None:
        """(the most tokens the target reads, where that figure comes from), None: not known."""
        if self.opts.max_positions:
            return self.opts.max_positions, "--max-positions"
        found = max_positions(self.opts.tokenizer)
        return None if found is None else (found, f"max_position_embeddings in {self.opts.tokenizer}")

    @cached_property
    def vocab(self) -> str | None:
        """The vocabulary fingerprint of the tokenizer in use (draftdeck.provenance.vocab_fingerprint)."""
        return vocab_fingerprint(self.opts.tokenizer)

    @cached_property
    def added_tokens(self) -> dict[str, int]:
        """The tokenizer's added tokens by their text: an end-of-turn recorded ids may stop before."""
        return {t.content: i for i, t in self.tok.added_tokens_decoder.items()}

    def vocab_differs(self, recorded: str | None) -> str | None:
        """Why ids recorded in vocabulary `recorded` cannot be used here; None: they can (a server's
        ids record none, and the decode check decides alone)."""
        if recorded is None or recorded == self.vocab:
            return None
        mine = (self.vocab or "none")[:19]
        return f"its ids were recorded in another vocabulary ({recorded[:19]}…; the tokenizer's: {mine}…)"

    @cached_property
    def vision(self) -> vision.Vision | None:
        """The target's image processor (None: a text target, which rejects rows with images)."""
        return vision.Vision.load(self.opts.tokenizer, self.tok)

    @property
    def may_drop(self) -> frozenset[str]:
        """The codes of the parts the template may drop on purpose (`template_may_drop`)."""
        return frozenset(DROPPED[part] for part in self.opts.template_may_drop)


_STATE: State | None = None


def use(state: State) -> None:
    """Make `state` the one :func:`process_chunk` uses in this process (and in processes forked after)."""
    global _STATE
    _STATE = state


@dataclass
class ChunkResult:
    report: Report
    block: Block
    fast_rows: int = 0
    hf_rows: int = 0
    verified: int = 0
    image_files: dict[str, bytes] = field(default_factory=dict)  # the kept rows' images, by stored name

    @property
    def rows(self) -> list[ShardRow]:
        b, off = self.block, self.block.offsets
        issues, mix, images, grids = b.row_issues(), b.row_mix_sources(), b.row_images(), b.row_image_grids()
        return [
            ShardRow(b.ids[off[i] : off[i + 1]], b.masks[off[i] : off[i + 1]], b.sources[i], b.source_rows[i],
                     b.turns[i], b.truncated[i], issues[i], mix[i], images[i], grids[i])
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
    answered_by: str = ""  # who wrote its assistant turns (a draftdeck.provenance key; "": no record)
    untrained: tuple[int, ...] = ()  # assistant messages a per-turn flag keeps out of the loss
    mix_source: str = ""  # the mix source the row came from (its provenance; "": not from a mix)
    # the token ids the answering model recorded, by message index, and their vocabulary (None: unknown)
    answer_ids: dict[int, list[int]] = field(default_factory=dict)
    ids_vocab: str | None = None
    # the conversation's images in order (draftdeck.tokenize.vision.item_images); [] for a text row
    images: list[dict[str, Any]] = field(default_factory=list)


def to_item(conv: Conversation) -> Item:
    src = conv.source
    line = None if src is None else (src.line if src.line is not None else src.index)
    origin = conv.origin()
    who = answered_by(conv.meta)
    ids = {i: m.token_ids for i, m in enumerate(conv.messages) if m.token_ids}
    messages = conversation_dicts(conv)
    images = vision.item_images(conv, messages) if any(m.images for m in conv.messages) else []
    return Item(messages, conv.tools, src.file if src else "(memory)", line,
                line if line is not None else -1, conv.has_assistant,
                origin[0] if origin else None, origin[1] if origin else -1, tuple(conv.warnings),
                who.key() if who else "", untrained_answers(conv), conv.mix_source, ids,
                recorded_vocab(conv.meta) if ids else None, images)  # fmt: skip


def recorded_vocab(meta: dict[str, Any]) -> str | None:
    """The vocabulary a regenerated row's token ids were recorded in (None: not recorded)."""
    gen = meta.get("generation")
    rec = gen.get("token_ids") if isinstance(gen, dict) else None
    vocab = rec.get("vocab") if isinstance(rec, dict) else None
    return vocab if isinstance(vocab, str) else None


def untrained_answers(conv: Conversation) -> tuple[int, ...]:
    """The indices of the assistant messages a per-turn flag keeps out of the loss."""
    return tuple(i for i, m in enumerate(conv.messages) if m.role == "assistant" and not m.trained)


def _encode(
    st: State, rendered: list[RenderedRow], first_chunk: bool
) -> tuple[list[Encoded], set[int], int, int]:
    out: list[Encoded | None] = [None] * len(rendered)
    hf_idx: list[int] = []
    fast_set: set[int] = set()
    verified = 0
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
        whole = st.opts.verify_all or first_chunk
        every = 1 if whole else max(1, st.opts.verify_every)
        check = [i for i in sorted(fast_set) if i % every == 0]
        # ids and offsets, as HF's own path writes them: every row of the first chunk (and with
        # --verify-all), and a sampled row whose text could place them apart (see HFEncoder.ids)
        plain = (
            set() if whole else {i for i in check if not rendered[i].literal and rendered[i].text.isascii()}
        )
        full = [i for i in check if i not in plain]
        ids_only = [i for i in check if i in plain]
        refs = st.hf.encode([rendered[i].text for i in full], [rendered[i].literal for i in full])
        bad = [i for i, (ids, starts) in zip(full, refs, strict=True) if not _same(out[i], ids, starts)]
        ref_ids = st.hf.ids([rendered[i].text for i in ids_only])
        bad += [i for i, ids in zip(ids_only, ref_ids, strict=True) if not _same(out[i], ids, None)]
        mismatches = [repr(rendered[i].text[:80]) for i in sorted(bad)]
        verified += len(check)
        if mismatches:
            raise EncoderMismatch(len(mismatches), mismatches[0])
    return out, fast_set, len(hf_idx), verified  # type: ignore[return-value]


def _same(got: Encoded | None, ids: Any, starts: np.ndarray | None) -> bool:
    """Whether the fast encoder's `got` has these ids (and these starts, unless None)."""
    assert got is not None
    return bool(np.array_equal(got[0], ids)) and (starts is None or bool(np.array_equal(got[1], starts)))


def _mask(starts: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    bounds = np.asarray([x for span in spans for x in span], dtype=np.int64)
    return (np.searchsorted(bounds, starts, side="right") % 2 == 1).astype(np.uint8)


def _runs(
    r: RenderedRow, ids: np.ndarray, starts: np.ndarray, skip: Collection[int] = ()
) -> Iterator[tuple[int, int, str]]:
    """The trained runs of a row: (first token, end token, the rendered text those tokens cover);
    `skip`: spans left out (replaced by the target's recorded ids, checked when planned)."""
    if not r.spans:
        return
    n = len(ids)
    bounds = np.searchsorted(starts, np.asarray(r.spans, dtype=np.int64).ravel(), side="left").tolist()
    for j, (lo, hi) in enumerate(zip(bounds[::2], bounds[1::2], strict=True)):
        if lo < hi and j not in skip:
            end = int(starts[hi]) if hi < n else len(r.text)
            yield lo, hi, r.text[int(starts[lo]) : end]


def _check_runs(
    st: State,
    rendered: list[RenderedRow],
    encoded: list[Encoded],
    fast_set: set[int],
    plans: list[target_ids.Plan] | None = None,
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
            hf_runs.extend(
                (k, ids[lo:hi], want)
                for lo, hi, want in _runs(r, ids, starts, plans[k].spans if plans else ())
            )
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
            for lo, hi, want in _runs(r, ids, starts, plans[k].spans if plans else ()):
                got_bytes = blob[byte_at[base + lo] : byte_at[base + hi]]
                if got_bytes != want.encode("utf-8"):
                    got = got_bytes.decode("utf-8", "replace")
                    bad_rows.setdefault(k, f"decoded {got[:60]!r} but the rendered text is {want[:60]!r}")
            base += len(ids)
    return bad_rows


def _plans(
    st: State, rendered: list[RenderedRow], encoded: list[Encoded], owners: list[Item]
) -> list[target_ids.Plan]:
    """What each row does with its answers' recorded token ids (draftdeck.tokenize.target_ids)."""
    if not any(o.answer_ids for o in owners):
        return [target_ids.Plan() for _ in rendered]

    def decode(lists: list[list[int]]) -> list[str]:
        return list(st.hf.backend.decode_batch(lists, skip_special_tokens=False))

    return target_ids.plan_rows(
        rendered, [starts for _, starts in encoded], [o.answer_ids for o in owners],
        [st.vocab_differs(o.ids_vocab) if o.answer_ids else None for o in owners], decode, st.added_tokens,
    )  # fmt: skip


def process_chunk(items: list[Item], first_chunk: bool = False) -> ChunkResult:
    st = _STATE
    assert st is not None, "worker state not initialised"
    opts = st.opts
    report = Report()
    rendered: list[RenderedRow] = []
    owners: list[Item] = []
    pictures = vision.ChunkImages(
        st.vision if any(i.images for i in items) else None, str(opts.tokenizer), opts.image_roots
    )
    for item in items:
        report.rows_in += 1
        file, line = item.file, item.line
        if not item.has_assistant:
            report.reject(
                "no_assistant_turn", file, line, "no assistant message: the conversation is prompt-only"
            )
            continue
        try:
            pictures.prepare(item)
        except RowRejected as exc:
            report.reject(exc.code, file, line, exc.reason)
            continue
        try:
            rows = render_rows(item.messages, item.tools, st.renderer, item.untrained)
        except TemplateError as exc:
            report.reject("template_error", file, line, str(exc)[:500])
            continue
        if not rows:
            n = len(item.untrained)
            report.reject("no_trained_tokens", file, line, f"all {n} answers are untrained by their flag")
            continue
        lost = dropped(item.messages, item.tools, rows, item.untrained)
        rejecting = [(c, why) for c, why in lost if c not in st.may_drop]
        if rejecting:
            report.reject(rejecting[0][0], file, line, rejecting[0][1])
            continue
        for c, why in lost:  # parts the template drops on purpose: kept, warned, badged
            report.warn(c, file, line, why)
            item.warnings = (*item.warnings, c)
        report.rows_expanded += len(rows) - 1
        answers = sum(1 for m in item.messages if m.get("role") == "assistant")
        report.counts["answers_trained"] += answers - len(item.untrained)
        if item.untrained:
            report.counts["answers_untrained_by_flag"] += len(item.untrained)
        rendered.extend(rows)
        owners.extend([item] * len(rows))

    encoded, fast_set, hf_n, verified = _encode(st, rendered, first_chunk)
    encoded = pictures.expand(rendered, encoded, owners)  # each image token -> its image's token count

    # Masks, the target's recorded ids where they fit, then the mask check: every other trained run
    # decodes to the rendered text it covers.
    masks = [_mask(starts, r.spans) for r, (_, starts) in zip(rendered, encoded, strict=True)]
    plans = _plans(st, rendered, encoded, owners)
    bad_rows = _check_runs(st, rendered, encoded, fast_set, plans)

    keep: list[tuple[np.ndarray, np.ndarray]] = []
    sources: list[str] = []
    source_rows: list[int] = []
    turns: list[int] = []
    truncs: list[bool] = []
    answered: list[str] = []
    mixed: list[str] = []  # per kept row: its mix source ("": none)
    images: list[list[str]] = []  # per kept row: its images' stored names, and their grids
    grids: list[list[int]] = []
    issues: list[list[str]] = []  # per kept row: its warning codes, the sample view's badges
    for k, (r, (ids, _)) in enumerate(zip(rendered, encoded, strict=True)):
        owner = owners[k]
        file, line, row_no = owner.file, owner.line, owner.row
        mask = masks[k]
        if k in bad_rows:
            report.reject("mask_mismatch", file, line, bad_rows[k])
            continue
        if k in pictures.bad:
            report.reject("template_error", file, line, pictures.bad[k])
            continue
        plan = plans[k]
        ids, mask = target_ids.apply(plan, ids, mask)
        truncated = False
        if opts.seq_length is not None and len(ids) > opts.seq_length:
            if opts.truncation == "drop":
                report.reject("too_long", file, line, f"{len(ids)} tokens > --seq-length {opts.seq_length}")
                continue
            ids, mask = ids[: opts.seq_length], mask[: opts.seq_length]
            truncated = True
        ids, mask, names, grid = pictures.fit(k, ids, mask)  # no image cut in two; 0 on image tokens
        if st.max_positions is not None and len(ids) > st.max_positions[0]:
            most, said = st.max_positions
            cut = "" if opts.seq_length else f"; --seq-length {most} cuts such rows to fit"
            report.reject("longer_than_target", file, line, f"{len(ids):,} tokens > {most:,} ({said}){cut}")
            continue
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
        path = plan.count(report, file, line)
        if path is not None:
            codes.append(path)
        issues.append(codes)
        report.rows_out += 1
        keep.append((ids, mask))
        sources.append(owner.origin_file or file)
        source_rows.append(owner.origin_row if owner.origin_file else row_no)
        turns.append(r.turn)
        truncs.append(truncated)
        answered.append(owner.answered_by)
        mixed.append(owner.mix_source)
        images.append(names)
        grids.append(grid)
        pictures.keep(k, report)
    block = Block(
        np.concatenate([i for i, _ in keep]).astype(np.int32) if keep else np.zeros(0, np.int32),
        np.concatenate([m for _, m in keep]).astype(np.uint8) if keep else np.zeros(0, np.uint8),
        np.asarray([len(i) for i, _ in keep], dtype=np.int64),
        sources, source_rows, turns, truncs, issues, answered, mixed if any(mixed) else None,
        images if any(images) else None, grids if any(images) else None,
    )  # fmt: skip
    return ChunkResult(report, block, len(fast_set), hf_n, verified, pictures.files)


def process_indexed(item: tuple[int, list[Item]]) -> ChunkResult:
    return process_chunk(item[1], first_chunk=item[0] == 0)
