"""Training rows from DraftDeck shards: a held-out split by conversation, a seeded epoch order with
a resumable position, collation, and the checks that must pass BEFORE any step.

- Split: a conversation (its source file's name + ``source_row``) goes to held-out iff a hash of it
  falls under `heldout_fraction`; rows split from one conversation (one per assistant turn) stay
  together, and the split does not depend on the order, the seed, the number of ranks or the folder.
- Order: epoch e visits the training rows in a permutation seeded by (seed, e). A `DataPosition`
  (epoch, index into that permutation) is what a checkpoint stores: resuming from it continues the
  same permutation, so no example is seen twice in an epoch.
- Anchors are drawn per example from a generator seeded by (seed, epoch, index), so the anchors of
  an example do not depend on how the global batch is cut across ranks or micro-batches.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from draftdeck.drafter.model.vision import ImageRows, RowImage
from draftdeck.errors import InputError, UsageError
from draftdeck.fileio import sha256_file
from draftdeck.provenance import Answered, ModelIdentity
from draftdeck.shards.manifest import Manifest
from draftdeck.shards.store import MANIFEST, ShardDataset, row_source_name


class DataError(UsageError):
    """The training data cannot be used with this target or these settings."""


class TokenizerMismatchError(DataError):
    """The dataset was tokenized with another tokenizer than the target's."""


class NoAnchorError(DataError):
    """No row has two consecutive trained tokens (no place for a DFlash block)."""


class RowTooLongError(DataError):
    """A row is longer than the target's positions."""


class EmptySplitError(DataError):
    """The held-out or the training split is empty."""


@dataclass(frozen=True)
class DataPosition:
    """Where the next global batch starts: `index` into epoch `epoch`'s permutation."""

    epoch: int = 0
    index: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataPosition:
        return cls(int(d["epoch"]), int(d["index"]))


def conversation_key(source: str, source_row: int) -> str:
    """A conversation by its source file's name and row: not its folder, so the split is the same
    wherever the data lives (another home, a file moved and tokenized again); with the whole path, a
    held-out row of one tokenization could be a training row of the next."""
    return f"{Path(source).name}\0{source_row}"


def is_heldout(source: str, source_row: int, fraction: float) -> bool:
    """Deterministic (sha256 of the conversation key), independent of order, seed and ranks."""
    if fraction <= 0:
        return False
    h = hashlib.sha256(conversation_key(source, source_row).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < fraction


def _has_anchor(offsets: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Per row: does some p have mask[p] and mask[p + 1] inside the row?"""
    m = masks.astype(bool)
    pair = np.zeros(len(m), dtype=np.int64)
    if len(m) > 1:
        pair[:-1] = m[:-1] & m[1:]
    # a pair straddling two rows starts at a row's last token: exclude it
    last = offsets[1:] - 1
    pair[last[last >= 0]] = 0
    csum = np.concatenate([[0], np.cumsum(pair)])
    return (csum[offsets[1:]] - csum[offsets[:-1]]) > 0


@dataclass(frozen=True)
class RowRef:
    dataset: int  # index into TrainData.datasets
    row: int  # row within that dataset
    length: int


class TrainData:
    """The rows of one or more dataset folders, split and checked.

    `train` and `heldout` are lists of `RowRef`; rows with no DFlash anchor are left out and
    counted in `no_anchor` (rows in = train + heldout + no_anchor).
    """

    def __init__(
        self, inputs: Sequence[str | Path], *, heldout_fraction: float, seq_length: int | None = None,
        image_token_id: int | None = None,
    ):  # fmt: skip
        """`image_token_id`: the target's image token, where it has a vision tower: the rows with images
        are then recorded in `image_rows` (None: the data has no image)."""
        if not inputs:
            raise DataError("no dataset folders given (inputs is empty)")
        self.paths = [Path(p) for p in inputs]
        self.datasets: list[ShardDataset] = []
        for p in self.paths:
            try:
                self.datasets.append(ShardDataset(p))
            except InputError as e:
                raise DataError(str(e)) from e
        self.seq_length = seq_length
        self.heldout_fraction = heldout_fraction
        self.train: list[RowRef] = []
        self.heldout: list[RowRef] = []
        self.no_anchor = 0
        self.truncated_rows = self.truncated_tokens = 0  # rows longer than seq_length, and what was cut
        self.longest_used = 0  # the longest row as training reads it (after seq_length)
        self.longest: tuple[int, str, int, Path] = (0, "", 0, self.paths[0])  # length, source, row, folder
        self.image_token_id = image_token_id
        self.image_rows: ImageRows | None = None  # the rows with images (draftdeck.drafter.model.vision)
        self.rows_with_images = 0
        self.images_by_row: dict[tuple[int, int], tuple[RowImage, ...]] = {}  # (dataset, row) -> its images
        for di, ds in enumerate(self.datasets):
            n = 0
            for batch in ds.iter_batches():
                self._index_images(di, ds, batch, n)
                n = self._index(di, ds.path, batch, n)
        self.rows_in = len(self.train) + len(self.heldout) + self.no_anchor

    def _index_images(self, di: int, ds: ShardDataset, batch: pa.RecordBatch, start: int) -> None:
        """Record the batch's rows with images (their files and grids): each row whole and as training
        cuts it, and the prompt of each of its trained turns (draftdeck.drafter.model.vision); a dataset
        with images for a target without a vision tower is refused."""
        if "images" not in batch.schema.names:
            return
        names, grids = batch.column("images").to_pylist(), batch.column("image_grid_thw").to_pylist()
        if not any(names):
            return
        if self.image_token_id is None:
            raise DataError(
                f"{ds.path}: the rows hold images, but the target has no vision tower to read them"
            )
        if self.image_rows is None:
            self.image_rows = ImageRows(self.image_token_id)
        ids_col, masks_col = batch.column("input_ids"), batch.column("loss_mask")
        for i, row_names in enumerate(names):
            if not row_names:
                continue
            flat, where = grids[i] or [], f"{ds.path} row {start + i}"
            if len(flat) != 3 * len(row_names):
                raise DataError(f"{where}: {len(row_names)} images but {len(flat)} grid values")
            try:
                images = tuple((ds.image_path(name), (flat[3 * k], flat[3 * k + 1], flat[3 * k + 2]))
                               for k, name in enumerate(row_names))  # fmt: skip
            except InputError as e:
                raise DataError(f"{where}: {e}") from e
            ids, mask = ids_col[i].values.to_numpy(), masks_col[i].values.to_numpy()
            self.image_rows.add(ids, images, where, strict=True)
            if self.seq_length is not None and len(ids) > self.seq_length:
                self.image_rows.add(ids[: self.seq_length], images, where, strict=True)
            starts = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int64)])) == 1)
            for s in starts:  # the prompt of each trained turn: what the target answers, what eval decodes
                self.image_rows.add(ids[:s], images, where, strict=False)
            self.images_by_row[(di, start + i)] = images
            self.rows_with_images += 1

    def images_of(self, ref: RowRef) -> tuple[RowImage, ...]:
        """A row's images in order (none for a text row)."""
        return self.images_by_row.get((ref.dataset, ref.row), ())

    def _index(self, di: int, path: Path, batch: pa.RecordBatch, start: int) -> int:
        masks_col = batch.column("loss_mask")
        offsets = np.asarray(masks_col.offsets, dtype=np.int64)
        offsets = offsets - offsets[0]
        masks = np.asarray(masks_col.flatten())  # respects a sliced batch (values would not)
        lengths = np.diff(offsets)
        anchored = _has_anchor(offsets, masks)
        sources = batch.column("source").to_pylist()
        rows = batch.column("source_row").to_pylist()
        for i in range(len(lengths)):
            length = int(lengths[i])
            if length > self.longest[0]:
                self.longest = (length, sources[i], int(rows[i]), path)
            if not anchored[i]:
                self.no_anchor += 1
                continue
            ref = RowRef(di, start + i, min(length, self.seq_length or length))
            if ref.length < length:
                self.truncated_rows += 1
                self.truncated_tokens += length - ref.length
            self.longest_used = max(self.longest_used, ref.length)
            (self.heldout if is_heldout(sources[i], rows[i], self.heldout_fraction) else self.train).append(
                ref
            )
        return start + len(lengths)

    # --- checks before any step -------------------------------------------------------------
    def manifests(self) -> list[Manifest]:
        return [ds.manifest for ds in self.datasets]

    def manifest_sha256(self) -> list[str]:
        return [sha256_file(p / MANIFEST) for p in self.paths]

    def check_tokenizer(self, target_folder: Path | None) -> None:
        """Each dataset's tokenizer fingerprint must equal the target folder's, computed the way
        draftdeck.tokenize does (tokenizer files + the chat template and kwargs the dataset used)."""
        from draftdeck.chat.render import tokenizer_fingerprint

        if target_folder is None:
            return
        for path, mf in zip(self.paths, self.manifests(), strict=True):
            tok = mf.tokenizer
            have = tok.fingerprint if tok is not None else None
            if tok is None or not have:
                raise TokenizerMismatchError(
                    f"{path / MANIFEST}: no tokenizer fingerprint; re-tokenize the dataset"
                )
            kwargs = mf.parameters.get("template_kwargs") or {}
            want = tokenizer_fingerprint(target_folder, tok.chat_template or "", kwargs)
            if want != have:
                raise TokenizerMismatchError(
                    f"{path}: tokenized with tokenizer fingerprint {have} ({tok.path}), but the "
                    f"target {target_folder} has fingerprint {want}: tokenize the data with the target's "
                    "tokenizer"
                )

    def check(self, max_positions: int, block_size: int) -> None:
        if not self.train and not self.heldout:
            raise NoAnchorError(
                f"{', '.join(map(str, self.paths))}: none of {self.no_anchor} rows has a DFlash anchor "
                "(two consecutive trained tokens): is the loss mask empty?"
            )
        if self.seq_length is not None and self.seq_length > max_positions:
            raise RowTooLongError(
                f"seq_length {self.seq_length} exceeds the target's {max_positions} positions"
            )
        length, source, row, folder = self.longest
        if self.seq_length is None and length > max_positions:
            raise RowTooLongError(
                f"{folder}: row {source}:{row} has {length} tokens, more than the target's {max_positions} "
                "positions; set seq_length to truncate"
            )
        if self.heldout_fraction > 0 and not self.heldout:
            raise EmptySplitError(
                f"the held-out split is empty (heldout_fraction {self.heldout_fraction} of "
                f"{len(self.train)} rows): raise heldout_fraction or add data"
            )
        if not self.train:
            raise EmptySplitError(f"the training split is empty ({len(self.heldout)} rows all held out)")
        if block_size > max_positions:
            raise DataError(f"block_size {block_size} exceeds the target's {max_positions} positions")

    # --- reading -----------------------------------------------------------------------------
    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(len(self.train))

    def example(self, ref: RowRef) -> tuple[np.ndarray, np.ndarray]:
        row = self.datasets[ref.dataset].row(ref.row)
        n = ref.length
        return np.asarray(row["input_ids"][:n], dtype=np.int64), np.asarray(
            row["loss_mask"][:n], dtype=np.int64
        )

    def source(self, ref: RowRef) -> str:
        """The row's source: its mix source's name when it comes from a mix, else its original file
        (what per-source counts, ``heldout/source/<name>/...``, group by)."""
        return row_source_name(self.datasets[ref.dataset].row(ref.row))

    def sample(self, n: int) -> list[RowRef]:
        """Up to `n` training rows spread evenly over the split (the pre-flight's rows)."""
        if n <= 0 or not self.train:
            return []
        step = len(self.train) / min(n, len(self.train))
        return [self.train[int(i * step)] for i in range(min(n, len(self.train)))]

    def provenance(self) -> Answered:
        """Rows by who answered them, over every dataset (from the manifests; a manifest written
        before provenance was kept counts its rows as having no record)."""
        by: dict[ModelIdentity, int] = {}
        none = 0
        for mf in self.manifests():
            if mf.provenance is None:
                none += mf.rows
                continue
            none += mf.provenance.no_record
            for ident, n in mf.provenance.by:
                by[ident] = by.get(ident, 0) + n
        return Answered(tuple(by.items()), none)

    def trained_token_counts(self, vocab_size: int) -> np.ndarray:
        """(vocab_size,) how often each id is a trained token (loss mask 1) of the training split, as
        training reads the rows (after seq_length): an EAGLE-3 run's draft vocabulary."""
        counts = np.zeros(vocab_size, dtype=np.int64)
        for di, ds in enumerate(self.datasets):
            kept = {ref.row: ref.length for ref in self.train if ref.dataset == di}
            start = 0
            for batch in ds.iter_batches():
                ids_col, masks_col = batch.column("input_ids"), batch.column("loss_mask")
                offsets = np.asarray(masks_col.offsets, dtype=np.int64)
                offsets = offsets - offsets[0]
                ids, masks = np.asarray(ids_col.flatten()), np.asarray(masks_col.flatten())
                trained = np.zeros(len(masks), dtype=bool)
                for i in range(len(offsets) - 1):
                    n = kept.get(start + i)
                    if n is not None:
                        trained[offsets[i] : offsets[i] + n] = True
                picked = ids[trained & (masks == 1)].astype(np.int64)
                if picked.size and int(picked.max()) >= vocab_size:
                    raise DataError(
                        f"{ds.path}: token id {int(picked.max())} is outside the target's {vocab_size}"
                    )
                counts += np.bincount(picked, minlength=vocab_size)
                start += len(offsets) - 1
        return counts

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": [str(p) for p in self.paths],
            "manifest_sha256": self.manifest_sha256(),
            "rows_in": self.rows_in,
            "train_rows": len(self.train),
            "heldout_rows": len(self.heldout),
            "no_anchor_rows": self.no_anchor,
            "truncated_rows": self.truncated_rows,
            "truncated_tokens": self.truncated_tokens,
            "longest_row_tokens": self.longest_used,
        } | ({"rows_with_images": self.rows_with_images} if self.rows_with_images else {})


def collate(
    examples: list[tuple[np.ndarray, np.ndarray]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to the longest: (input_ids, attention_mask, loss_mask), each (bsz, T)."""
    t = max(len(ids) for ids, _ in examples)
    ids = np.full((len(examples), t), pad_id, dtype=np.int64)
    att = np.zeros((len(examples), t), dtype=np.int64)
    lm = np.zeros((len(examples), t), dtype=np.int64)
    for i, (x, m) in enumerate(examples):
        ids[i, : len(x)], att[i, : len(x)], lm[i, : len(x)] = x, 1, m
    return tuple(torch.from_numpy(a).to(device) for a in (ids, att, lm))  # type: ignore[return-value]


def anchor_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The generator for one example's anchors: depends only on (seed, epoch, index)."""
    h = hashlib.sha256(json.dumps([seed, epoch, index]).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(h[:8], "big") & (2**63 - 1))
