"""One row as the sample page shows it (its facts and a window of chips), and how the same row
differs between two datasets (the compare page)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

import pyarrow.compute as pc

from draftdeck.browse.info import DatasetInfo
from draftdeck.browse.loading import open_store, token_table
from draftdeck.browse.tokens import Chip, chips_for, fold_images, id_chips
from draftdeck.issue_codes import CODES, NOTES
from draftdeck.shards.store import ShardDataset

CHIP_WINDOW = 4096  # tokens drawn per page; longer rows get links to the next and previous windows


@dataclass
class Sample:
    n: int
    total: int  # rows in the dataset
    chips: list[Chip]  # the drawn window
    window: tuple[int, int] | None  # None: the whole row is drawn
    window_prev: int | None
    window_next: int | None
    n_tokens: int
    n_trained: int
    n_anchors: int
    length_mismatch: bool  # input_ids and loss_mask differ in length
    stored_n_trained: Any
    truncated: Any
    source: Any
    source_row: Any
    turn: Any
    notice: str | None  # why the chips show ids instead of text
    issues: list[tuple[str, str]]  # the row's warning codes with what they mean: the page's badges
    notes: list[tuple[str, str, str]]  # the row's codes that are no issue (quality.NOTES): code, label, text


def read_sample(info: DatasetInfo, n: int, window_from: int = 0, roots: Iterable[Path] = ()) -> Sample:
    """Row n's facts (over the whole row) and its chips; at most CHIP_WINDOW chips are drawn, from
    `window_from`, so a 32K-token row costs no more to draw than a 4K one."""
    store = open_store(info.path)
    row = store.row(n)
    ids = [int(t) for t in row["input_ids"]]
    mask = [int(m) for m in row["loss_mask"]]
    tok_dir = info.tokenizer_dir(roots)  # `roots`: where to look for it by fingerprint
    notice = None
    if tok_dir is not None:
        chips = fold_images(chips_for(ids, mask, token_table(tok_dir)), row.get("images"))  # an image: 1 chip
    else:
        notice = (
            f"the tokenizer {info.tokenizer_path!r} is not on this machine: showing token ids"
            if info.tokenizer_path
            else "the manifest names no tokenizer: showing token ids"
        )
        chips = id_chips(ids, mask)
    w0 = min(max(window_from, 0), max(len(chips) - 1, 0))
    w0 -= w0 % CHIP_WINDOW
    w1 = min(w0 + CHIP_WINDOW, len(chips))
    whole = (w0, w1) == (0, len(chips))
    return Sample(
        n=n,
        total=len(store),
        chips=chips if whole else chips[w0:w1],
        window=None if whole else (w0, w1),
        window_prev=max(w0 - CHIP_WINDOW, 0) if w0 > 0 else None,
        window_next=w1 if w1 < len(chips) else None,
        n_tokens=len(ids),
        n_trained=sum(1 for m in mask if m),
        n_anchors=sum(1 for c in chips if c.anchor),
        length_mismatch=len(ids) != len(mask),
        stored_n_trained=row.get("n_trained"),
        truncated=row.get("truncated"),
        source=row.get("source"),
        source_row=row.get("source_row"),
        turn=row.get("turn"),
        notice=notice,
        issues=[(c, what) for c, what in row_issues(row) if c not in NOTES],
        notes=[(c, *NOTES[c]) for c, _ in row_issues(row) if c in NOTES],
    )


def row_issues(row: dict[str, Any]) -> list[tuple[str, str]]:
    """(code, description) of each warning a kept row carries: its stored ``issues`` column, and
    for shards written before that column, what the row itself says (``truncated``)."""
    codes = [str(c) for c in row.get("issues") or ()]
    if row.get("truncated") and "truncated" not in codes:
        codes.append("truncated")
    return [(c, CODES[c].description if c in CODES else "") for c in codes]


@dataclass(frozen=True)
class RowDiff:
    same_ids: bool
    first_id: int | None  # the first position whose token ids differ
    mask_diff: int  # positions with the same id and another mask
    first_mask: int | None
    len_a: int
    len_b: int


def row_diff(a: Sample, b: Sample) -> RowDiff:
    """How the same row differs between two datasets, position by position; marks the chips whose mask
    differs (``diff``) on both sides. Masks are compared only up to the first position whose ids
    differ: past it the rows are out of step (a changed template shifts everything after), and an id
    that happens to agree there says nothing about the mask."""
    ca, cb = a.chips, b.chips
    first_id = next((i for i, (x, y) in enumerate(zip(ca, cb, strict=False)) if x.id != y.id), None)
    if first_id is None and len(ca) != len(cb):
        first_id = min(len(ca), len(cb))
    in_step = min(len(ca), len(cb)) if first_id is None else first_id
    mask_diff = [i for i in range(in_step) if ca[i].mask != cb[i].mask]
    for i in mask_diff:
        ca[i].diff = cb[i].diff = True
    return RowDiff(
        first_id is None, first_id, len(mask_diff), mask_diff[0] if mask_diff else None, len(ca), len(cb)
    )


RowKey = tuple[str, int, int | None]


def row_key(sample: Sample) -> RowKey | None:
    """What identifies a row across datasets made from the same data: (source file, row in it, turn).
    None when the dataset does not record its source."""
    if not sample.source or sample.source_row is None:
        return None
    return str(sample.source), int(sample.source_row), None if sample.turn is None else int(sample.turn)


def find_row(store: ShardDataset, key: RowKey) -> int | None:
    """The first row of `store` with this (source, source row, turn), or None. A source path that
    differs only in its folder (the data was moved or tokenized elsewhere) matches by file name when
    no row has the exact path."""
    sources, rows, turns = store.column("source"), store.column("source_row"), store.column("turn")
    if sources is None or rows is None:
        return None
    source, source_row, turn = key
    same_row = pc.equal(rows, source_row)
    if turns is not None and turn is not None:
        same_row = pc.and_(same_row, pc.equal(turns, turn))
    for wanted in (pc.equal(sources, source), pc.ends_with(sources, "/" + PurePath(source).name)):
        hits = pc.indices_nonzero(pc.fill_null(pc.and_(same_row, wanted), False))
        if len(hits):
            return int(hits[0].as_py())
    return None
