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
from draftdeck.fileio import atomic_output, load_torch
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
    try:
        return np.load(path).astype(np.int64)
    except (OSError, ValueError) as exc:  # a pickled object array is refused by numpy: named here
        raise InputError(f"{path}: not the token counts `draftdeck tokenize` writes ({exc})") from None


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


def read_draft_vocab(path: Path, counts: np.ndarray) -> DraftVocab:
    """A draft vocabulary from a file: ours (`write_draft_vocab`'s .npz or .json), SpecForge's
    `vocab_mapping.pt` (a dict of d2t and t2d tensors) or an EAGLE-3 checkpoint's or flat export's
    `model.safetensors` (its d2t and t2d: a warm start's mapping), checked against the target's
    vocabulary (the length of `counts`, its trained-token counts, which also give the coverage; a
    shorter t2d, over the tokenizer, is the target's with the rest unmarked). InputError names the
    file and what is wrong."""
    path = Path(path)
    if path.suffix not in VOCAB_SUFFIXES:
        raise UsageError(
            f"{path}: a draft vocabulary is draftdeck vocab's .npz or .json, SpecForge's vocab_mapping.pt,"
            " or an EAGLE-3 checkpoint's model.safetensors"
        )
    if not path.is_file():
        raise InputError(f"{path}: no such file (a draft vocabulary: draftdeck vocab --out writes one)")
    try:
        loaded = _load_vocab_file(path)
    except (OSError, ValueError, RuntimeError, EOFError) as exc:  # unreadable, not JSON, not a pickle
        raise InputError(f"{path}: cannot read a draft vocabulary ({exc})") from exc
    if not isinstance(loaded, dict):
        raise InputError(f"{path}: a mapping of d2t and t2d expected, not {type(loaded).__name__}")
    arrays = {k: np.asarray(loaded[k]) for k in ("d2t", "t2d") if k in loaded}
    missing = [k for k in ("d2t", "t2d") if k not in arrays]
    if missing:
        raise InputError(f"{path}: no {' or '.join(missing)} (a draft vocabulary holds d2t and t2d)")
    d2t, t2d = arrays["d2t"].astype(np.int64).reshape(-1), arrays["t2d"].reshape(-1)
    if len(t2d) > len(counts):
        raise InputError(f"{path}: t2d has {len(t2d):,} entries; the target's vocabulary has {len(counts):,}")
    # `draftdeck vocab` counts over the tokenizer, which a target's embedding often pads beyond (Qwen3:
    # 151,669 tokens, 151,936 rows): ids past the file's are never drafted
    t2d = np.pad(t2d.astype(bool), (0, len(counts) - len(t2d)))
    ids = np.arange(len(d2t), dtype=np.int64) + d2t
    if not len(ids) or int(t2d.sum()) != len(ids):
        raise InputError(
            f"{path}: t2d marks {int(t2d.sum()):,} ids; d2t has {len(ids):,} (they must agree, >= 1)"
        )
    if ids[0] < 0 or ids[-1] >= len(t2d) or np.any(np.diff(ids) <= 0) or not t2d[ids].all():
        raise InputError(f"{path}: draft id + d2t is not the increasing list of the ids t2d marks")
    total = int(counts.sum())
    return DraftVocab(
        ids, counts[ids].astype(np.int64), d2t, t2d, float(counts[ids].sum()) / total if total else 0.0
    )


VOCAB_SUFFIXES = (".npz", ".json", ".pt", ".safetensors")


def _load_vocab_file(path: Path) -> object:
    if path.suffix == ".safetensors":  # a checkpoint or flat export: its two mapping tensors alone
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            return {k: f.get_tensor(k) for k in ("d2t", "t2d") if k in f.keys()}  # noqa: SIM118
    if path.suffix == ".npz":
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    if path.suffix == ".json":
        return json.loads(path.read_bytes())
    return load_torch(path, "write the mapping again with `draftdeck vocab --out FILE.npz`")


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
    """One JSON object per row: {"input_ids": [...], "loss_mask": [...]}. Returns the row count. A
    dataset with images adds each row's images (absolute paths of the stored files) and their
    ``image_grid_thw``: its image tokens mean nothing without them."""
    n = 0
    folder = str(ds.images_dir.resolve())
    with atomic_output(out) as f:
        for batch in ds.iter_batches():
            ids = batch.column("input_ids").to_pylist()
            masks = batch.column("loss_mask").to_pylist()
            pictured = "images" in batch.schema.names
            images = batch.column("images").to_pylist() if pictured else [None] * len(ids)
            grids = batch.column("image_grid_thw").to_pylist() if pictured else [None] * len(ids)
            for a, m, names, grid in zip(ids, masks, images, grids, strict=True):
                row: dict[str, object] = {"input_ids": a, "loss_mask": m}
                if pictured:
                    row["images"] = [f"{folder}/{name}" for name in names]
                    row["image_grid_thw"] = grid
                f.write(orjson.dumps(row) + b"\n")
                n += 1
    return n
