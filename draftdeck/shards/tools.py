"""Draft vocabulary and export of a tokenized dataset.

Draft vocabulary (EAGLE-3 style): the K token ids most frequent among trained tokens
(``trained_token_counts.npy``, written by the tokenize job), in ascending id order.

- ``d2t`` (int64, K): draft id -> target id offset: ``target_id = draft_id + d2t[draft_id]``
  (EAGLE-3's and SpecForge's convention);
- ``t2d`` (bool, vocab size): whether a target id is in the draft vocabulary;
- ``ids`` (int64, K): the target ids themselves; ``counts`` (int64, K): their trained counts.

``.npz`` holds these four arrays; ``.json`` holds the same as lists (``t2d`` as a list of booleans).
Ties in frequency are broken by the lower id, so the result is deterministic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from draftdeck.errors import InputError, UsageError
from draftdeck.fileio import atomic_output
from draftdeck.shards.stats import TOKEN_COUNTS
from draftdeck.shards.store import ShardDataset


@dataclass
class DraftVocab:
    ids: np.ndarray
    counts: np.ndarray
    d2t: np.ndarray
    t2d: np.ndarray
    coverage: float  # share of trained tokens whose id is in the draft vocabulary


def trained_token_counts(dataset: Path) -> np.ndarray:
    """(tokenizer size,) int64: how often each id is a trained token of `dataset` (tokenize's counts)."""
    path = Path(dataset) / TOKEN_COUNTS
    if not path.is_file():
        raise InputError(f"{dataset} has no {TOKEN_COUNTS} (not written by `draftdeck tokenize`?)")
    return np.load(path).astype(np.int64)


def draft_vocab(dataset: Path, top: int) -> DraftVocab:
    return vocab_of_counts(trained_token_counts(dataset), top)


def vocab_of_counts(counts: np.ndarray, top: int) -> DraftVocab:
    """The `top` most frequent ids of `counts` (one per target id), ties to the lower id."""
    if top < 1:
        raise UsageError("--top must be at least 1")
    k = min(top, len(counts))
    order = np.lexsort((np.arange(len(counts)), -counts))[:k]
    ids = np.sort(order).astype(np.int64)
    t2d = np.zeros(len(counts), dtype=bool)
    t2d[ids] = True
    total = int(counts.sum())
    return DraftVocab(
        ids=ids,
        counts=counts[ids].astype(np.int64),
        d2t=ids - np.arange(k, dtype=np.int64),
        t2d=t2d,
        coverage=float(counts[ids].sum()) / total if total else 0.0,
    )


def write_draft_vocab(vocab: DraftVocab, out: Path) -> None:
    if out.suffix == ".json":
        body = {
            "format": "eagle3-draft-vocab",
            "note": "target_id = draft_id + d2t[draft_id]; t2d[target_id] is true for draft tokens",
            "draft_vocab_size": len(vocab.ids),
            "target_vocab_size": len(vocab.t2d),
            "coverage": vocab.coverage,
            "ids": vocab.ids.tolist(),
            "counts": vocab.counts.tolist(),
            "d2t": vocab.d2t.tolist(),
            "t2d": vocab.t2d.tolist(),
        }
        with atomic_output(out, "w") as f:
            json.dump(body, f)
    elif out.suffix == ".npz":
        with atomic_output(out) as f:
            np.savez(f, d2t=vocab.d2t, t2d=vocab.t2d, ids=vocab.ids, counts=vocab.counts)
    else:
        raise UsageError(f"--out must end in .npz or .json, not {out.name!r}")


def export_speculators_jsonl(ds: ShardDataset, out: Path) -> int:
    """One JSON object per row: {"input_ids": [...], "loss_mask": [...]}. Returns the row count."""
    n = 0
    with atomic_output(out) as f:
        for batch in ds.iter_batches():
            ids = batch.column("input_ids").to_pylist()
            masks = batch.column("loss_mask").to_pylist()
            for a, m in zip(ids, masks, strict=True):
                f.write(orjson.dumps({"input_ids": a, "loss_mask": m}) + b"\n")
                n += 1
    return n
