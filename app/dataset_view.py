"""What the dataset pages show, without the web: dataset facts from manifest.json / stats.json, rows by
random access, token chips, filters, bounded text search and alerts.

Rows are read by random access from memory-mapped Arrow shards, so a sample page costs the same at 10K
and at 1M rows. Filters are vectorised over the memory-mapped columns (Arrow compute), computed once
per (dataset, filter) and cached. Text search decodes rows in batches, with a bounded budget per
request, and says how far it looked.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MANIFEST = "manifest.json"
STATS = "stats.json"
ROLE_STARTS = frozenset({"<|im_start|>", "<|start_header_id|>", "<start_of_turn>"})
HIGH_TRUNCATION = 0.10  # alert when more than this fraction of rows was cut at the sequence length
SEARCH_BUDGET_ROWS = 20_000
SEARCH_BUDGET_SECONDS = 2.0
SEARCH_BATCH = 512
MAX_MAPPED_SHARDS = 512  # memory maps kept open per dataset (address space and one descriptor each)


class BrowseError(Exception):
    """A request the data cannot answer (row out of range, bad filter): shown to the user, never a 500."""


# -- dataset facts ------------------------------------------------------------------------------------


def _read_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, ValueError) as exc:
        return None, f"{path.name} cannot be read: {exc}"
    if not isinstance(data, dict):
        return None, f"{path.name} is not a JSON object"
    return data, None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass
class Shard:
    file: str
    rows: int | None
    bytes: int | None
    sha256: str | None
    size_on_disk: int | None  # None: the file is missing

    @property
    def zero_bytes(self) -> bool:
        return self.bytes == 0 or self.size_on_disk == 0


@dataclass
class DatasetInfo:
    """Everything the list and overview pages say about one dataset directory."""

    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    rows: int = 0
    tokens: int | None = None
    trained: int | None = None
    shards: list[Shard] = field(default_factory=list)
    tokenizer_path: str | None = None
    report: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    readable: bool = False  # the Arrow data opens

    @property
    def trained_fraction(self) -> float | None:
        return self.trained / self.tokens if self.tokens and self.trained is not None else None


def tokenizer_path_of(manifest: dict[str, Any]) -> str | None:
    tok = manifest.get("tokenizer")
    if isinstance(tok, dict):
        for key in ("path", "dir", "directory", "name_or_path"):
            if isinstance(tok.get(key), str):
                return str(tok[key])
    if isinstance(tok, str):
        return tok
    value = manifest.get("tokenizer_path")
    return value if isinstance(value, str) else None


def _version(path: Path) -> tuple[int, ...]:
    """Changes when the dataset is rewritten (the writer renames files into place)."""
    stamps = []
    for name in (MANIFEST, "state.json", "dataset_info.json"):
        try:
            stamps.append((path / name).stat().st_mtime_ns)
        except OSError:
            stamps.append(0)
    return tuple(stamps)


_infos: OrderedDict[str, tuple[tuple[int, ...], DatasetInfo]] = OrderedDict()
_infos_lock = threading.Lock()


def cached_info(path: Path) -> DatasetInfo:
    """:func:`load_info`, cached until the dataset's metadata files change: what the sample pages use, so
    their cost does not grow with the number of shards (the overview pages read everything afresh)."""
    key, version = str(path), _version(path)
    with _infos_lock:
        hit = _infos.get(key)
        if hit is not None and hit[0] == version:
            _infos.move_to_end(key)
            return hit[1]
    info = load_info(path)
    with _infos_lock:
        _infos[key] = (version, info)
        while len(_infos) > MAX_OPEN_STORES:
            _infos.popitem(last=False)
    return info


def load_info(path: Path) -> DatasetInfo:
    info = DatasetInfo(path=path)
    if not path.is_dir():
        info.problems.append(f"{path} is not a directory (moved or deleted?)")
        return info
    manifest, problem = _read_json(path / MANIFEST)
    if problem:
        info.problems.append(problem)
    info.manifest = manifest or {}
    stats, problem = _read_json(path / STATS)
    if problem:
        info.problems.append(problem)
    info.stats = stats or {}
    m, s = info.manifest, info.stats
    for raw in m.get("shards") or []:
        if not isinstance(raw, dict):
            continue
        name = str(raw.get("filename") or raw.get("file") or raw.get("path") or raw.get("name") or "?")
        on_disk = path / Path(name).name if not Path(name).is_absolute() else Path(name)
        size = on_disk.stat().st_size if on_disk.is_file() else None
        if size is None:
            info.problems.append(f"shard {name} is listed in the manifest but missing on disk")
        info.shards.append(
            Shard(name, _int(raw.get("rows")), _int(raw.get("bytes")), raw.get("sha256"), size)
        )
    info.tokenizer_path = tokenizer_path_of(m)
    report = m.get("report")
    info.report = report if isinstance(report, dict) else None
    try:
        store = open_store(path)
        info.readable = True
        info.rows = len(store)
    except BrowseError as exc:
        info.problems.append(str(exc))
        info.rows = _int(m.get("rows")) or sum(sh.rows or 0 for sh in info.shards)
    totals: dict[str, int] = {}
    if info.readable:
        try:
            totals = store_totals(path)
        except BrowseError as exc:
            info.problems.append(str(exc))
    info.tokens = _int(m.get("tokens")) or _int(s.get("tokens")) or totals.get("tokens")
    info.trained = (
        _int(m.get("trained_tokens"))
        or _int(s.get("trained_tokens"))
        or _int(m.get("n_trained"))
        or totals.get("trained")
    )
    return info


# -- rows by random access -----------------------------------------------------------------------------


class RowStore:
    """Random access to the rows of one dataset directory, memory-mapped.

    Rows come from the project's :class:`draftdeck.shards.ShardDataset` (one binary search and a zero-copy
    slice of one memory-mapped shard). A folder without a DraftDeck manifest (a peer's `save_to_disk`
    output, say) is read with HF `datasets.load_from_disk`, also memory-mapped with O(1) row access.
    Whole columns (for filters and search) are the shards' record batches, zero-copy, built on first use.
    """

    def __init__(self, path: Path):
        self.path = path
        self.version = _version(path)
        self._shards: Any = None
        self._table: pa.Table | None = None
        self._columns: dict[str, Any] = {}
        self._lock = threading.RLock()
        manifest, _ = _read_json(path / MANIFEST)
        if manifest and isinstance(manifest.get("shards"), list):
            from draftdeck.shards.store import ShardDataset

            try:
                # Keep every shard mapped (up to MAX_MAPPED_SHARDS): reopening one costs ~0.5 ms, so with the
                # reader's default LRU of 8 a random row of a 100-shard dataset would cost 10x one of 1 shard.
                self._shards = ShardDataset(path, max_open=MAX_MAPPED_SHARDS)
                self._n = len(self._shards)
                names = set(self._schema_names())
            except Exception as exc:
                raise BrowseError(
                    f"{path.name}: the shards cannot be opened ({type(exc).__name__}: {exc})"
                ) from exc
        else:
            self._table = self._load_from_disk(path)
            self._n = int(self._table.num_rows)
            names = set(self._table.column_names)
        missing = {"input_ids", "loss_mask"} - names
        if missing:
            raise BrowseError(f"{path.name}: no column {', '.join(sorted(missing))}; not a tokenized dataset")

    def _schema_names(self) -> list[str]:
        if not self._shards.shards:
            return ["input_ids", "loss_mask"]
        first = self.path / self._shards.shards[0].filename
        with pa.memory_map(str(first), "r") as source:
            return list(pa.ipc.open_stream(source).schema.names)

    @staticmethod
    def _load_from_disk(path: Path) -> pa.Table:
        if not (path / "state.json").exists():
            raise BrowseError(
                f"{path.name}: no manifest.json or state.json here (expected a tokenized dataset folder)"
            )
        try:
            import datasets

            ds = datasets.load_from_disk(str(path))
        except Exception as exc:
            raise BrowseError(
                f"{path.name}: the Arrow data cannot be opened ({type(exc).__name__}: {exc})"
            ) from exc
        if not isinstance(ds, datasets.Dataset):
            raise BrowseError(f"{path.name}: holds several splits; register one split's directory")
        table = ds.data.table
        if ds._indices is not None:  # a filtered/shuffled view: materialise the mapping once
            table = table.take(ds._indices.column(0))
        return table

    @property
    def table(self) -> pa.Table:
        """The whole dataset as one Arrow table over the memory-mapped shards (zero-copy)."""
        with self._lock:
            if self._table is None:
                try:
                    batches = list(self._shards.iter_batches())
                except Exception as exc:
                    raise BrowseError(
                        f"{self.path.name}: a shard cannot be read ({type(exc).__name__}: {exc})"
                    ) from exc
                self._table = (
                    pa.Table.from_batches(batches)
                    if batches
                    else pa.Table.from_batches([], schema=self._shards_schema())
                )
            return self._table

    def _shards_schema(self) -> pa.Schema:
        from draftdeck.shards.store import schema

        return schema()

    def __len__(self) -> int:
        return self._n

    def row(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            if not len(self):
                raise BrowseError(f"row {index} is out of range: this dataset has no rows")
            raise BrowseError(f"row {index} is out of range: this dataset has rows 0 to {len(self) - 1:,}")
        if self._shards is not None:
            with self._lock:  # ShardDataset keeps an LRU of open shards that is not thread-safe
                try:
                    return dict(self._shards.row(index))
                except Exception as exc:
                    shard = self._shards.shards[self._shards.locate(index)[0]].filename
                    raise BrowseError(
                        f"row {index} cannot be read: shard {shard} is damaged ({type(exc).__name__}: {exc})"
                    ) from exc
        assert self._table is not None
        return self._table.slice(index, 1).to_pylist()[0]

    def take_ids(self, indices: np.ndarray) -> list[list[int]]:
        return self.table.column("input_ids").take(pa.array(indices)).to_pylist()

    def column(self, name: str) -> pa.ChunkedArray | None:
        if name not in self.table.column_names:
            return None
        return self.table.column(name)

    def lengths(self) -> np.ndarray:
        return self._cached("__len", lambda: self._list_lengths("input_ids"))

    def n_trained(self) -> np.ndarray:
        def compute() -> np.ndarray:
            col = self.column("n_trained")
            if col is not None:
                return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
            mask = self.table.column("loss_mask")
            out = np.zeros(len(self), dtype=np.int64)
            at = 0
            for chunk in mask.chunks:
                flat = chunk.flatten().to_numpy(zero_copy_only=False)
                offsets = chunk.offsets.to_numpy()
                sums = np.add.reduceat(flat, offsets[:-1]) if len(flat) else np.zeros(len(chunk))
                sums[offsets[:-1] == offsets[1:]] = 0
                out[at : at + len(chunk)] = sums
                at += len(chunk)
            return out

        return self._cached("__n_trained", compute)

    def _list_lengths(self, name: str) -> np.ndarray:
        col = self.column("seq_len")
        if col is not None:
            return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
        return np.asarray(
            pc.list_value_length(self.table.column(name)).to_numpy(zero_copy_only=False), dtype=np.int64
        )

    def _cached(self, key: str, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._columns:
                self._columns[key] = make()
            return self._columns[key]


_stores: OrderedDict[str, RowStore] = OrderedDict()
_stores_lock = threading.Lock()
MAX_OPEN_STORES = 16


def open_store(path: Path) -> RowStore:
    key = str(path)
    version = _version(path)
    with _stores_lock:
        store = _stores.get(key)
        if store is not None and store.version == version:
            _stores.move_to_end(key)
            return store
    store = RowStore(path)
    with _stores_lock:
        _stores[key] = store
        _stores.move_to_end(key)
        while len(_stores) > MAX_OPEN_STORES:
            _stores.popitem(last=False)
    return store


def forget_store(path: Path) -> None:
    with _stores_lock:
        _stores.pop(str(path), None)
    with _infos_lock:
        _infos.pop(str(path), None)


def store_totals(path: Path) -> dict[str, int]:
    store = open_store(path)
    return store._cached(
        "__totals", lambda: {"tokens": int(store.lengths().sum()), "trained": int(store.n_trained().sum())}
    )


# -- tokens --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes-to-unicode table used by byte-level BPE vocabularies."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class TokenTable:
    """Token id -> raw bytes (or a special token's label), cached per id. Thread-safe for reading."""

    def __init__(self, path: str):
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only: never the network
        from transformers import AutoTokenizer

        self.path = path
        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.size = len(self.tok)
        decoder = json.loads(self.tok.backend_tokenizer.to_str()).get("decoder") or {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders") or []}
        self.byte_level = "ByteLevel" in kinds
        self.special: dict[int, str] = {}
        self.added: dict[int, str] = {}
        for tid, added in self.tok.added_tokens_decoder.items():
            (self.special if added.special else self.added)[tid] = added.content
        self._bytes: dict[int, bytes | None] = {}
        self._pieces: dict[int, tuple[str | None, bytes, str | None, str | None]] = {}

    def piece(self, tid: int) -> tuple[str | None, bytes, str | None, str | None]:
        """(special label, raw bytes, text when the bytes are whole UTF-8 on their own, that text made
        visible), cached per id: the common token costs one dict lookup."""
        hit = self._pieces.get(tid)
        if hit is None:
            label = self.label(tid)
            if label is not None:
                hit = (label, b"", None, None)
            else:
                data = self.piece_bytes(tid)
                try:
                    whole: str | None = data.decode("utf-8")
                except UnicodeDecodeError:
                    whole = None
                hit = (None, data, whole, visible(whole) if whole else None)
            self._pieces[tid] = hit
        return hit

    def label(self, tid: int) -> str | None:
        """A special token's label, or None for an ordinary piece of text."""
        if tid in self.special:
            return self.special[tid]
        if tid in self.added and self.added[tid].startswith("<") and self.added[tid].endswith(">"):
            return self.added[tid]
        if not 0 <= tid < self.size:
            return f"<unknown id {tid}>"
        return None

    def piece_bytes(self, tid: int) -> bytes:
        cached = self._bytes.get(tid)
        if cached is not None:
            return cached
        if tid in self.added:
            out = self.added[tid].encode()
        else:
            text = self.tok.backend_tokenizer.id_to_token(tid)
            if not isinstance(text, str):
                out = b""
            elif self.byte_level:
                table = _byte_decoder()
                out = bytes(table[c] for c in text) if all(c in table for c in text) else text.encode()
            else:
                m = _BYTE_FALLBACK.match(text)
                out = bytes([int(m.group(1), 16)]) if m else text.replace("\u2581", " ").encode()
        self._bytes[tid] = out
        return out

    def decode(self, batch: list[list[int]]) -> list[str]:
        return self.tok.batch_decode(batch, skip_special_tokens=False)


_tables: dict[str, TokenTable] = {}
_tables_lock = threading.Lock()


def token_table(path: str) -> TokenTable:
    with _tables_lock:
        table = _tables.get(path)
    if table is None:
        try:
            table = TokenTable(path)
        except Exception as exc:
            raise BrowseError(
                f"the tokenizer at {path} cannot be loaded ({type(exc).__name__}: {exc})"
            ) from exc
        with _tables_lock:
            table = _tables.setdefault(path, table)
    return table


_VISIBLE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


def visible(text: str) -> str:
    """Whitespace and control characters made visible; everything else unchanged."""
    out = []
    for ch in text:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 32:
            out.append(chr(0x2400 + ord(ch)))
        elif ch == "\x7f":
            out.append("␡")
        else:
            out.append(ch)
    return "".join(out)


def _utf8_len(lead: int) -> int:
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


@dataclass(slots=True)
class Chip:
    pos: int
    id: int
    mask: int
    text: str = ""  # what the chip shows
    raw: str = ""  # the text the token stands for (tooltip)
    kind: str = "text"  # text | special | cont (bytes that finish a character shown on an earlier chip)
    newline: bool = False
    anchor: bool = False
    edge: bool = False  # the mask changes here
    role: str | None = None  # a turn starts here, for this role
    diff: bool = False  # compare view: the other dataset's mask differs at this position

    @property
    def cls(self) -> str:
        parts = ["tok", "tr" if self.mask else "cx", self.kind]
        if self.anchor:
            parts.append("anchor")
        if self.edge:
            parts.append("edge")
        if self.diff:
            parts.append("diff")
        return " ".join(parts)


def chips_for(ids: list[int], mask: list[int], table: TokenTable) -> list[Chip]:
    """One chip per token. Characters split over several byte-level tokens are shown whole on the
    token where they start; the tokens that only finish them are marked as continuations."""
    n = len(ids)
    chips = [Chip(pos=i, id=int(ids[i]), mask=int(mask[i]) if i < len(mask) else 0) for i in range(n)]
    texts = [""] * n
    pending = bytearray()
    owners: list[int] = []
    own: list[bytes] = [b""] * n

    def drain(final: bool) -> None:
        while pending:
            need = _utf8_len(pending[0])
            if need == 0:
                texts[owners[0]] += f"\\x{pending[0]:02x}"
                del pending[0], owners[0]
                continue
            if len(pending) < need:
                if not final:
                    return
                texts[owners[0]] += f"\\x{pending[0]:02x}"
                del pending[0], owners[0]
                continue
            try:
                ch = bytes(pending[:need]).decode("utf-8")
            except UnicodeDecodeError:
                texts[owners[0]] += f"\\x{pending[0]:02x}"
                del pending[0], owners[0]
                continue
            texts[owners[0]] += ch
            del pending[:need], owners[:need]

    shown: list[str | None] = [None] * n  # visible text, when known from the per-id cache
    for i, chip in enumerate(chips):
        label, data, whole, vis = table.piece(chip.id)
        if label is not None:
            drain(final=True)
            chip.kind = "special"
            chip.text = chip.raw = label
            continue
        if not data:
            continue
        own[i] = data
        if not pending and whole is not None:  # the usual case: the token is whole characters
            texts[i] = whole
            shown[i] = vis
            continue
        pending.extend(data)
        owners.extend([i] * len(data))
        drain(final=False)
    drain(final=True)

    role_from: int | None = None
    for i, chip in enumerate(chips):
        if chip.kind != "special":
            chip.raw = texts[i]
            if texts[i]:
                chip.text = shown[i] or visible(texts[i])
                chip.newline = texts[i].endswith("\n")
            elif own[i]:
                chip.kind = "cont"
                chip.text = "+"
                chip.raw = f"bytes {own[i].hex(' ')}: the rest of a character shown on an earlier chip"
        chip.edge = i > 0 and chip.mask != chips[i - 1].mask
        chip.anchor = bool(chip.mask) and i + 1 < n and bool(chips[i + 1].mask)
        if chip.kind == "special" and chip.text in ROLE_STARTS:
            role_from = i
            continue
        if role_from is not None and (chip.kind == "special" or "\n" in texts[i]):
            name = "".join(texts[j] for j in range(role_from + 1, i + 1)).strip()
            chips[role_from].role = name or "turn"
            role_from = None
    if role_from is not None:
        chips[role_from].role = "".join(texts[j] for j in range(role_from + 1, n)).strip() or "turn"
    return chips


# -- filters and navigation ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    source: str | None = None
    truncated: bool | None = None
    turn: int | None = None
    min_len: int | None = None
    max_len: int | None = None
    min_frac: float | None = None
    max_frac: float | None = None
    q: str | None = None

    @property
    def structural(self) -> bool:
        return any(v is not None for k, v in self.__dict__.items() if k != "q")

    def query(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in self.__dict__.items():
            if value is None:
                continue
            out[key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return out

    @classmethod
    def parse(cls, params: dict[str, str]) -> Filters:
        """From query parameters; empty values mean no filter. Raises BrowseError saying what is wrong."""

        def get(name: str) -> str | None:
            value = params.get(name)
            return value.strip() if value and value.strip() else None

        def integer(name: str) -> int | None:
            value = get(name)
            if value is None:
                return None
            try:
                n = int(value)
            except ValueError:
                raise BrowseError(f"{name} must be a whole number, not {value!r}") from None
            if n < (-1 if name == "turn" else 0):
                raise BrowseError(
                    f"{name} must be 0 or more{' (or -1: every turn)' if name == 'turn' else ''}, not {n}"
                )
            return n

        def fraction(name: str) -> float | None:
            value = get(name)
            if value is None:
                return None
            try:
                f = float(value)
            except ValueError:
                raise BrowseError(f"{name} must be a number between 0 and 1, not {value!r}") from None
            if not (0.0 <= f <= 1.0) or math.isnan(f):
                raise BrowseError(f"{name} must be between 0 and 1, not {value}")
            return f

        trunc = get("truncated")
        if trunc not in (None, "1", "0", "true", "false", "yes", "no"):
            raise BrowseError(f"truncated must be yes or no, not {trunc!r}")
        f = cls(
            source=get("source"),
            truncated=None if trunc is None else trunc in ("1", "true", "yes"),
            turn=integer("turn"),
            min_len=integer("min_len"),
            max_len=integer("max_len"),
            min_frac=fraction("min_frac"),
            max_frac=fraction("max_frac"),
            q=get("q"),
        )
        if f.min_len is not None and f.max_len is not None and f.min_len > f.max_len:
            raise BrowseError(f"the length range is empty: min_len {f.min_len} > max_len {f.max_len}")
        if f.min_frac is not None and f.max_frac is not None and f.min_frac > f.max_frac:
            raise BrowseError(
                f"the trained-fraction range is empty: min_frac {f.min_frac} > max_frac {f.max_frac}"
            )
        return f


_matches: OrderedDict[tuple[Any, ...], np.ndarray] = OrderedDict()
_matches_lock = threading.Lock()
MAX_CACHED_MATCHES = 32


def matching_rows(store: RowStore, f: Filters) -> np.ndarray | None:
    """Sorted indices of the rows passing the structural filters (None: every row passes)."""
    if not f.structural:
        return None
    key = (
        str(store.path),
        store.version,
        f.source,
        f.truncated,
        f.turn,
        f.min_len,
        f.max_len,
        f.min_frac,
        f.max_frac,
    )
    with _matches_lock:
        hit = _matches.get(key)
        if hit is not None:
            _matches.move_to_end(key)
            return hit
    keep = np.ones(len(store), dtype=bool)
    if f.source is not None:
        col = store.column("source")
        if col is None:
            raise BrowseError("this dataset has no source column to filter on")
        keep &= np.asarray(pc.fill_null(pc.equal(col, f.source), False).to_numpy(zero_copy_only=False))
    if f.truncated is not None:
        col = store.column("truncated")
        if col is None:
            raise BrowseError("this dataset has no truncated column to filter on")
        keep &= np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool) == f.truncated
    if f.turn is not None:
        col = store.column("turn")
        if col is None:
            raise BrowseError("this dataset has no turn column to filter on")
        keep &= np.asarray(col.to_numpy(zero_copy_only=False)) == f.turn
    if f.min_len is not None or f.max_len is not None:
        lengths = store.lengths()
        if f.min_len is not None:
            keep &= lengths >= f.min_len
        if f.max_len is not None:
            keep &= lengths <= f.max_len
    if f.min_frac is not None or f.max_frac is not None:
        lengths = store.lengths()
        frac = store.n_trained() / np.maximum(lengths, 1)
        if f.min_frac is not None:
            keep &= frac >= f.min_frac - 1e-12
        if f.max_frac is not None:
            keep &= frac <= f.max_frac + 1e-12
    rows = np.flatnonzero(keep)
    with _matches_lock:
        _matches[key] = rows
        while len(_matches) > MAX_CACHED_MATCHES:
            _matches.popitem(last=False)
    return rows


@dataclass
class Step:
    """Where a navigation request landed: a row, or None with a message saying why."""

    row: int | None
    message: str | None = None
    searched: int = 0  # rows decoded for a text search
    resume_at: int | None = None  # where to continue a search that ran out of budget


def _candidates(store: RowStore, f: Filters, start: int, direction: int) -> Iterator[int]:
    """Rows passing the structural filters, from `start` (inclusive) in `direction`."""
    n = len(store)
    rows = matching_rows(store, f)
    if rows is None:
        yield from (range(start, n) if direction > 0 else range(start, -1, -1))
        return
    if direction > 0:
        at = int(np.searchsorted(rows, start, side="left"))
        yield from (int(r) for r in rows[at:])
    else:
        at = int(np.searchsorted(rows, start, side="right")) - 1
        yield from (int(r) for r in rows[at::-1] if at >= 0)


def first_match(store: RowStore, table: TokenTable | None, f: Filters, start: int, direction: int) -> Step:
    """The first row at or after `start` (before, when direction < 0) passing every filter, text search
    included. The search decodes at most SEARCH_BUDGET_ROWS rows / SEARCH_BUDGET_SECONDS per call."""
    n = len(store)
    if n == 0:
        return Step(None, "this dataset has no rows")
    if not 0 <= start < n:
        edge = "last" if start >= n else "first"
        return Step(None, f"this is the {edge} row" + (" that matches" if f.structural or f.q else ""))
    if not f.q:
        for row in _candidates(store, f, start, direction):
            return Step(row)
        return Step(
            None, "no row matches these filters" + (" in this direction" if start not in (0, n - 1) else "")
        )
    if table is None:
        raise BrowseError("text search needs the tokenizer, which this dataset does not name")
    needle = f.q.casefold()
    deadline = time.monotonic() + SEARCH_BUDGET_SECONDS
    searched = 0
    batch: list[int] = []
    last = start
    candidates = _candidates(store, f, start, direction)
    while True:
        batch = [r for _, r in zip(range(SEARCH_BATCH), candidates, strict=False)]
        if not batch:
            return Step(
                None,
                f"no row contains {f.q!r}" + (" with these filters" if f.structural else ""),
                searched=searched,
            )
        texts = table.decode(store.take_ids(np.asarray(batch, dtype=np.int64)))
        searched += len(batch)
        for row, text in zip(batch, texts, strict=True):
            if needle in text.casefold():
                return Step(row, searched=searched)
        last = batch[-1]
        if searched >= SEARCH_BUDGET_ROWS or time.monotonic() > deadline:
            resume = last + direction
            if not 0 <= resume < n:
                return Step(None, f"no row contains {f.q!r}", searched=searched)
            return Step(
                None,
                f"{f.q!r} not found in the {searched:,} rows searched (up to row {last:,})",
                searched=searched,
                resume_at=resume,
            )


def random_match(store: RowStore, table: TokenTable | None, f: Filters, rng: random.Random) -> Step:
    n = len(store)
    if n == 0:
        return Step(None, "this dataset has no rows")
    rows = matching_rows(store, f)
    if rows is not None and len(rows) == 0:
        return Step(None, "no row matches these filters")
    pick = rng.randrange(n) if rows is None else int(rows[rng.randrange(len(rows))])
    if not f.q:
        return Step(pick)
    step = first_match(store, table, f, pick, 1)
    if step.row is None and step.resume_at is None and pick > 0:
        step = first_match(store, table, f, 0, 1)  # wrap around once
    return step


def position_in(store: RowStore, f: Filters, row: int) -> tuple[int | None, int]:
    """(1-based position of `row` among the rows passing the structural filters, how many pass)."""
    rows = matching_rows(store, f)
    if rows is None:
        return row + 1, len(store)
    at = int(np.searchsorted(rows, row))
    return (at + 1 if at < len(rows) and rows[at] == row else None), len(rows)


# -- alerts --------------------------------------------------------------------------------------------


def alerts_for(info: DatasetInfo) -> list[tuple[str, str]]:
    """(kind, message) for every problem a user must see about this dataset."""
    out: list[tuple[str, str]] = []
    name = info.path.name
    if info.readable and info.rows == 0:
        out.append(("empty_output", f"dataset {name} has no rows: nothing to train on"))
    for shard in info.shards:
        if shard.zero_bytes:
            out.append(("zero_byte_shard", f"dataset {name}: shard {shard.file} is 0 bytes"))
    if info.readable and info.rows:
        try:
            out.extend(_column_alerts(info))
        except BrowseError as exc:
            out.append(("unreadable_shard", str(exc)))
    return out


def _column_alerts(info: DatasetInfo) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    name = info.path.name
    if info.rows:
        store = open_store(info.path)
        untrained = int((store.n_trained() == 0).sum())
        if untrained:
            out.append(
                (
                    "no_trained_tokens",
                    f"dataset {name}: {untrained:,} of {info.rows:,} rows have no trained token",
                )
            )
        col = store.column("truncated")
        if col is not None:
            cut = int(np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool).sum())
            if cut / info.rows > HIGH_TRUNCATION:
                out.append(
                    (
                        "high_truncation",
                        f"dataset {name}: {cut:,} of {info.rows:,} rows "
                        f"({cut / info.rows:.0%}) were cut at the sequence length",
                    )
                )
    return out


# -- statistics ----------------------------------------------------------------------------------------


def _histogram(raw: Any) -> dict[str, list[float]] | None:
    """Normalise a histogram to {"edges": [...n+1], "counts": [...n]}. Accepts a list of bins
    ``[{"min", "max", "rows"}]`` (draftdeck.shards.stats; empty bins may be left out, the last ``max``
    may be None) or ``{"edges", "counts"}``."""
    if isinstance(raw, list):
        bins = sorted(
            (b for b in raw if isinstance(b, dict) and isinstance(b.get("min"), int | float)),
            key=lambda b: b["min"],
        )
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
                hi_f = float(hi) + (1 if integer else 0)  # integer bins are inclusive: [min, max]
            if edges and edges[-1] < lo:  # a gap: bins with no rows were left out
                counts.append(0.0)
                edges.append(lo)
            if not edges:
                edges.append(lo)
            counts.append(float(b.get("rows") or b.get("count") or 0))
            edges.append(hi_f)
        return {"edges": edges, "counts": counts}
    if not isinstance(raw, dict):
        return None
    counts_raw = raw.get("counts") or raw.get("count") or raw.get("values")
    edges_raw = raw.get("edges") or raw.get("bins") or raw.get("bin_edges")
    if not isinstance(counts_raw, list) or not isinstance(edges_raw, list) or not counts_raw:
        return None
    if len(edges_raw) == len(counts_raw):  # left edges only: add the last right edge
        width = (edges_raw[-1] - edges_raw[-2]) if len(edges_raw) > 1 else 1
        edges_raw = [*edges_raw, edges_raw[-1] + width]
    if len(edges_raw) != len(counts_raw) + 1:
        return None
    return {"edges": [float(e) for e in edges_raw], "counts": [float(c) for c in counts_raw]}


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
    s = info.stats
    per_source_raw = s.get("per_source") or s.get("sources") or {}
    per_source: list[dict[str, Any]] = []
    if isinstance(per_source_raw, dict):
        for name, v in per_source_raw.items():
            if isinstance(v, dict):
                per_source.append(
                    {
                        "source": str(name),
                        "rows": _int(v.get("rows")) or 0,
                        "tokens": _int(v.get("tokens")) or 0,
                        "trained": _int(v.get("trained_tokens") or v.get("trained")) or 0,
                    }
                )
    elif isinstance(per_source_raw, list):
        for v in per_source_raw:
            if isinstance(v, dict):
                per_source.append(
                    {
                        "source": str(v.get("source") or v.get("name") or "?"),
                        "rows": _int(v.get("rows")) or 0,
                        "tokens": _int(v.get("tokens")) or 0,
                        "trained": _int(v.get("trained_tokens") or v.get("trained")) or 0,
                    }
                )
    return {
        "rows": info.rows,
        "tokens": info.tokens,
        "trained": info.trained,
        "length": _labelled(_histogram(s.get("length_histogram") or s.get("lengths")), integer=True),
        "trained_fraction": _labelled(
            _histogram(s.get("trained_fraction_histogram") or s.get("trained_fraction")), integer=False
        ),
        "per_source": sorted(per_source, key=lambda r: -r["rows"]),
    }
