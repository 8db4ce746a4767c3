"""Whole-dataset statistics, accumulated row by row while shards are written.

``stats.json`` holds: a histogram of row lengths (tokens), a histogram of the trained fraction of
each row, rows / tokens / trained tokens per source file and per mix source (``mix_sources``: the
rows of a mix only, by their source's name), rows by the model that answered them (``provenance``,
see draftdeck.provenance) and the most frequent trained tokens.
The full frequency of every token id over trained tokens goes to ``trained_token_counts.npy``
(int64, one entry per id of the tokenizer), which ``draftdeck vocab`` reads to build a draft
vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from draftdeck.errors import InputError
from draftdeck.fileio import atomic_output
from draftdeck.provenance import Answered

LENGTH_EDGES = [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 1 << 62]
FRACTION_BINS = 10
TOKEN_COUNTS = "trained_token_counts.npy"
STATS = "stats.json"


class Stats:
    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.lengths = np.zeros(len(LENGTH_EDGES) - 1, dtype=np.int64)
        self.fractions = np.zeros(FRACTION_BINS, dtype=np.int64)
        self.token_counts = np.zeros(vocab_size, dtype=np.int64)
        self.sources: dict[str, dict[str, int]] = {}
        self.mix_sources: dict[str, dict[str, int]] = {}  # as `sources`, rows with a mix source only
        self.answered: dict[str, int] = {}  # rows per provenance key ("": no record)
        self.rows = 0
        self.tokens = 0
        self.trained = 0
        self._pending: list[np.ndarray] = []  # trained ids not yet counted (one bincount per batch)
        self._pending_n = 0

    def add(
        self, input_ids: np.ndarray, loss_mask: np.ndarray, source: str, answered_by: str = "",
        mix_source: str = "",
    ) -> None:  # fmt: skip
        n = len(input_ids)
        self.answered[answered_by] = self.answered.get(answered_by, 0) + 1
        k = int(loss_mask.sum())
        self.rows += 1
        self.tokens += n
        self.trained += k
        self.lengths[np.searchsorted(LENGTH_EDGES, n, side="right") - 1] += 1
        frac = k / n if n else 0.0
        self.fractions[min(int(frac * FRACTION_BINS), FRACTION_BINS - 1)] += 1
        _count_row(self.sources, source, n, k)
        if mix_source:
            _count_row(self.mix_sources, mix_source, n, k)
        trained_ids = input_ids[loss_mask.astype(bool)]
        if len(trained_ids):
            self._pending.append(trained_ids)
            self._pending_n += len(trained_ids)
            if self._pending_n >= 1 << 20:
                self._count()

    def add_block(self, block: Any) -> None:
        """Add every row of a :class:`draftdeck.shards.store.Block` (vectorised)."""
        n = len(block)
        if not n:
            return
        lengths = block.lengths
        trained = block.n_trained()
        self.rows += n
        self.tokens += int(lengths.sum())
        self.trained += int(trained.sum())
        self.lengths += np.bincount(np.searchsorted(LENGTH_EDGES, lengths, side="right") - 1,
                                    minlength=len(self.lengths))[: len(self.lengths)]  # fmt: skip
        frac = np.minimum(
            (trained / np.maximum(lengths, 1) * FRACTION_BINS).astype(np.int64), FRACTION_BINS - 1
        )
        self.fractions += np.bincount(frac, minlength=FRACTION_BINS)
        for source, length, k in zip(block.sources, lengths.tolist(), trained.tolist(), strict=True):
            _count_row(self.sources, source, length, k)
        if block.mix_sources is not None:
            for name, length, k in zip(block.mix_sources, lengths.tolist(), trained.tolist(), strict=True):
                if name:
                    _count_row(self.mix_sources, name, length, k)
        for key in block.row_answered_by():
            self.answered[key] = self.answered.get(key, 0) + 1
        ids = block.ids[block.masks.astype(bool)]
        if len(ids):
            self._pending.append(ids)
            self._pending_n += len(ids)
            if self._pending_n >= 1 << 20:
                self._count()

    def _count(self) -> None:
        if self._pending:
            ids = np.concatenate(self._pending)
            self.token_counts += np.bincount(ids, minlength=self.vocab_size)[: self.vocab_size]
        self._pending = []
        self._pending_n = 0

    def merge(self, other: Stats) -> None:
        """Add the counts of `other` (e.g. one chunk's statistics) to these."""
        if other.vocab_size != self.vocab_size:
            raise ValueError(f"vocabulary sizes differ: {self.vocab_size} vs {other.vocab_size}")
        other._count()
        self._count()
        self.rows += other.rows
        self.tokens += other.tokens
        self.trained += other.trained
        self.lengths += other.lengths
        self.fractions += other.fractions
        self.token_counts += other.token_counts
        for mine, theirs in ((self.sources, other.sources), (self.mix_sources, other.mix_sources)):
            for source, counts in theirs.items():
                src = mine.setdefault(source, {"rows": 0, "tokens": 0, "trained_tokens": 0})
                for key, n in counts.items():
                    src[key] += n
        for key, n in other.answered.items():
            self.answered[key] = self.answered.get(key, 0) + n

    def save_state(self, path: Path) -> None:
        """Every count, to merge later (:meth:`load_state`), in one .npz file written atomically."""
        self._count()
        counts = {"rows": self.rows, "tokens": self.tokens, "trained": self.trained, "sources": self.sources,
                  "mix_sources": self.mix_sources, "answered": self.answered}  # fmt: skip
        meta = json.dumps(counts, ensure_ascii=False)
        with atomic_output(path) as f:
            np.savez(f, lengths=self.lengths, fractions=self.fractions, token_counts=self.token_counts,
                     meta=np.frombuffer(meta.encode("utf-8"), dtype=np.uint8))  # fmt: skip

    @classmethod
    def load_state(cls, path: Path) -> Stats:
        try:
            with np.load(path, allow_pickle=False) as z:
                stats = cls(len(z["token_counts"]))
                stats.lengths = z["lengths"].copy()
                stats.fractions = z["fractions"].copy()
                stats.token_counts = z["token_counts"].copy()
                meta = json.loads(z["meta"].tobytes().decode("utf-8"))
        except (OSError, ValueError, KeyError, EOFError) as exc:  # numpy refuses pickled object arrays
            raise InputError(f"{path}: not the statistics file a tokenize chunk writes ({exc})") from None
        stats.rows, stats.tokens, stats.trained = meta["rows"], meta["tokens"], meta["trained"]
        stats.sources = meta["sources"]
        stats.mix_sources = meta.get("mix_sources") or {}  # a state saved before it: no mix source
        stats.answered = meta.get("answered") or {"": stats.rows}  # a state saved before it: no record
        return stats

    @property
    def provenance(self) -> Answered:
        return Answered.from_counts(self.answered)

    def to_dict(self, top: int = 50) -> dict[str, Any]:
        self._count()
        order = np.argsort(-self.token_counts, kind="stable")[:top]
        return {
            "rows": self.rows,
            "tokens": self.tokens,
            "trained_tokens": self.trained,
            "trained_fraction": self.trained / self.tokens if self.tokens else 0.0,
            "length_histogram": [
                {
                    "min": LENGTH_EDGES[i],
                    "max": LENGTH_EDGES[i + 1] - 1 if i + 2 < len(LENGTH_EDGES) else None,
                    "rows": int(c),
                }
                for i, c in enumerate(self.lengths)
                if c
            ],
            "trained_fraction_histogram": [
                {"min": i / FRACTION_BINS, "max": (i + 1) / FRACTION_BINS, "rows": int(c)}
                for i, c in enumerate(self.fractions)
            ],
            "sources": dict(sorted(self.sources.items())),
            "mix_sources": dict(sorted(self.mix_sources.items())),
            "provenance": self.provenance.to_dict(),
            "distinct_trained_tokens": int(np.count_nonzero(self.token_counts)),
            "top_trained_tokens": [
                {"id": int(i), "count": int(self.token_counts[i])} for i in order if self.token_counts[i]
            ],
            "token_counts_file": TOKEN_COUNTS,
        }

    def write(self, out_dir: Path) -> None:
        self._count()
        with atomic_output(out_dir / TOKEN_COUNTS) as f:
            np.save(f, self.token_counts)
        with atomic_output(out_dir / STATS, "w") as f:
            json.dump(self.to_dict(), f, indent=2, ensure_ascii=False)


def _count_row(into: dict[str, dict[str, int]], name: str, tokens: int, trained: int) -> None:
    """One row of `tokens` tokens, `trained` of them trained, counted under `name`."""
    src = into.get(name)
    if src is None:
        src = into[name] = {"rows": 0, "tokens": 0, "trained_tokens": 0}
    src["rows"] += 1
    src["tokens"] += tokens
    src["trained_tokens"] += trained
