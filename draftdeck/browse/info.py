"""What the list and overview pages say about a dataset folder: its manifest, its statistics, its
shards on disk, totals, and the alerts it deserves (the rules live in :mod:`draftdeck.quality`)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftdeck.browse.errors import BrowseError
from draftdeck.browse.loading import MAX_OPEN_STORES, LoadOnce, forget_store, open_store, version_of
from draftdeck.dataset_alerts import DatasetAlert, DatasetFacts, dataset_alerts
from draftdeck.errors import InputError
from draftdeck.shards.manifest import MANIFEST, Manifest, read_manifest
from draftdeck.shards.stats import STATS
from draftdeck.shards.tokenizer_lookup import find_tokenizer


@dataclass
class ShardFacts:
    file: str
    rows: int
    bytes: int
    sha256: str
    size_on_disk: int | None  # None: the file is missing

    @property
    def zero_bytes(self) -> bool:
        return self.bytes == 0 or self.size_on_disk == 0


@dataclass
class DatasetInfo:
    """Everything the list and overview pages say about one dataset directory."""

    path: Path
    manifest: Manifest | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    rows: int = 0
    tokens: int | None = None
    trained: int | None = None
    shards: list[ShardFacts] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    readable: bool = False  # the Arrow data opens

    @property
    def trained_fraction(self) -> float | None:
        return self.trained / self.tokens if self.tokens and self.trained is not None else None

    @property
    def tokenizer_path(self) -> str | None:
        tok = self.manifest.tokenizer if self.manifest else None
        return tok.path if tok else None

    @property
    def report(self) -> dict[str, Any] | None:
        return self.manifest.report if self.manifest else None

    def tokenizer_dir(self, roots: Iterable[Path] = ()) -> str | None:
        """The tokenizer folder when it is on this machine: by the path the manifest records, else by
        its fingerprint among the tokenizers under `roots` (draftdeck/shards/tokenizer_lookup.py)."""
        if self.manifest is None:
            return None
        found = find_tokenizer(self.manifest, self.path, roots)
        return str(found) if found is not None else None


def _read_stats(path: Path) -> tuple[dict[str, Any], str | None]:
    try:
        data = json.loads((path / STATS).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, f"{STATS} is missing"
    except (OSError, ValueError) as exc:
        return {}, f"{STATS} cannot be read: {exc}"
    return (data, None) if isinstance(data, dict) else ({}, f"{STATS} is not a JSON object")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def load_info(path: Path) -> DatasetInfo:
    """The facts of a dataset folder, read afresh (the overview pages); each problem is said in words."""
    info = DatasetInfo(path=path)
    if not path.is_dir():
        info.problems.append(f"{path} is not a directory (moved or deleted?)")
        return info
    if (path / MANIFEST).exists():
        try:
            info.manifest = read_manifest(path)
        except InputError as exc:
            info.problems.append(str(exc))
    else:
        info.problems.append(f"{MANIFEST} is missing")
    info.stats, problem = _read_stats(path)
    if problem:
        info.problems.append(problem)
    for s in info.manifest.shards if info.manifest else []:
        on_disk = path / s.filename
        size = on_disk.stat().st_size if on_disk.is_file() else None
        if size is None:
            info.problems.append(f"shard {s.filename} is listed in the manifest but missing on disk")
        info.shards.append(ShardFacts(s.filename, s.rows, s.bytes, s.sha256, size))
    totals: dict[str, int] = {}
    try:
        store = open_store(path)
        info.readable = True
        info.rows = len(store)
        totals = {"tokens": int(store.lengths().sum()), "trained": int(store.n_trained().sum())}
    except InputError as exc:
        info.problems.append(str(exc))
        if not info.readable:
            info.rows = info.manifest.rows if info.manifest else 0
    stated_tokens, stated_trained = _count(info.stats.get("tokens")), _count(info.stats.get("trained_tokens"))
    info.tokens = stated_tokens if stated_tokens is not None else totals.get("tokens")
    info.trained = stated_trained if stated_trained is not None else totals.get("trained")
    return info


_infos: LoadOnce[str, DatasetInfo] = LoadOnce(lambda key: load_info(Path(key)), MAX_OPEN_STORES)


def cached_info(path: Path) -> DatasetInfo:
    """:func:`load_info`, cached until the dataset's metadata files change: what the sample pages use, so
    their cost does not grow with the number of shards (the overview pages read everything afresh)."""
    return _infos.get(str(path), version_of(path))


def forget_dataset(path: Path) -> None:
    """Forget what this process holds of a dataset folder: its open reader and its facts."""
    forget_store(path)
    _infos.forget(str(path))


# -- alerts ----------------------------------------------------------------------------------------


def facts_of(info: DatasetInfo) -> DatasetFacts:
    zero = tuple(s.file for s in info.shards if s.zero_bytes)
    if not (info.readable and info.rows):
        return DatasetFacts(info.path.name, info.readable, info.rows, zero)
    try:
        store = open_store(info.path)
        untrained = int((store.n_trained() == 0).sum())
        col = store.column("truncated")
        cut = None if col is None else int(np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool).sum())
    except InputError as exc:
        return DatasetFacts(info.path.name, True, info.rows, zero, unreadable=str(exc))
    return DatasetFacts(info.path.name, True, info.rows, zero, untrained, cut)


def alerts_for(info: DatasetInfo) -> list[DatasetAlert]:
    return dataset_alerts(facts_of(info))


# -- statistics ------------------------------------------------------------------------------------


def _histogram(bins_raw: Any) -> dict[str, list[float]] | None:
    """{"edges": [...n+1], "counts": [...n]} from draftdeck.shards.stats' bins ``[{"min", "max", "rows"}]``
    (empty bins may be left out; the last ``max`` may be None; integer bins are inclusive)."""
    if not isinstance(bins_raw, list):
        return None
    bins = sorted((b for b in bins_raw if isinstance(b, dict) and isinstance(b.get("min"), int | float)),
                  key=lambda b: b["min"])  # fmt: skip
    if not bins:
        return None
    integer = all(isinstance(b.get("min"), int) for b in bins)
    edges: list[float] = []
    counts: list[float] = []
    for b in bins:
        lo = float(b["min"])
        hi = b.get("max")
        if hi is None:
            width = (edges[-1] - edges[-2]) if len(edges) > 1 else max(lo, 1.0)
            hi_f = lo + width
        else:
            hi_f = float(hi) + (1 if integer else 0)
        if edges and edges[-1] < lo:  # a gap: bins with no rows were left out
            counts.append(0.0)
            edges.append(lo)
        if not edges:
            edges.append(lo)
        counts.append(float(b.get("rows") or 0))
        edges.append(hi_f)
    return {"edges": edges, "counts": counts}


def _labelled(h: dict[str, list[float]] | None, integer: bool) -> dict[str, Any] | None:
    """Add a label per bin: "64-127" for integer bins (inclusive), "0.2-0.3" for fractions."""
    if h is None:
        return None
    edges = h["edges"]
    if integer:
        labels = [
            f"{int(a)}-{int(b) - 1}" if b - a > 1 else f"{int(a)}" for a, b in itertools.pairwise(edges)
        ]
    else:
        labels = [f"{a:g}-{b:g}" for a, b in itertools.pairwise(edges)]
    return {**h, "labels": labels}


def stats_payload(info: DatasetInfo) -> dict[str, Any]:
    """What the statistics page draws, from stats.json as draftdeck.shards.stats writes it."""
    sources = info.stats.get("sources")
    per_source = [
        {"source": str(name), "rows": _count(v.get("rows")) or 0, "tokens": _count(v.get("tokens")) or 0,
         "trained": _count(v.get("trained_tokens")) or 0}
        for name, v in (sources.items() if isinstance(sources, dict) else ())
        if isinstance(v, dict)
    ]  # fmt: skip
    return {
        "rows": info.rows,
        "tokens": info.tokens,
        "trained": info.trained,
        "length": _labelled(_histogram(info.stats.get("length_histogram")), integer=True),
        "trained_fraction": _labelled(
            _histogram(info.stats.get("trained_fraction_histogram")), integer=False
        ),
        "per_source": sorted(per_source, key=lambda r: -r["rows"]),
        "per_mix_source": mix_sources_of(info),
    }


def mix_sources_of(info: DatasetInfo) -> list[dict[str, Any]]:
    """Rows and tokens per mix source (stats.json's ``mix_sources``), most rows first: each source's
    counts, and the shares and means computed from them here (stats.json keeps only counts). Shares
    are of the whole dataset's rows and trained tokens; empty when no row comes from a mix."""
    raw = info.stats.get("mix_sources")
    rows_all = _count(info.stats.get("rows")) or info.rows
    trained_all = _count(info.stats.get("trained_tokens")) or info.trained or 0
    out = []
    for name, v in raw.items() if isinstance(raw, dict) else ():
        if not isinstance(v, dict):
            continue
        rows, tokens = _count(v.get("rows")) or 0, _count(v.get("tokens")) or 0
        trained = _count(v.get("trained_tokens")) or 0
        out.append({
            "name": str(name), "rows": rows, "tokens": tokens, "trained": trained,
            "row_share": rows / rows_all if rows_all else None,
            "trained_share": trained / trained_all if trained_all else None,
            "mean_tokens": tokens / rows if rows else None,
        })  # fmt: skip
    return sorted(out, key=lambda r: (-r["rows"], r["name"]))


def sources_of(info: DatasetInfo, limit: int = 500) -> list[str]:
    return [s["source"] for s in stats_payload(info)["per_source"]][:limit]


__all__ = [
    "BrowseError",
    "DatasetInfo",
    "ShardFacts",
    "alerts_for",
    "cached_info",
    "load_info",
    "mix_sources_of",
    "stats_payload",
]
