"""Shard stores and tokenizers, each loaded once per process and kept in a bounded cache.

Right after a restart, many readers ask for the same dataset at once. :class:`LoadOnce` lets the first
of them load it while the others wait for that load (single flight) instead of loading it again each,
and keeps at most `size` values, least recently used out first. Loads run in the calling thread: the
routes that call them are plain ``def`` routes, which FastAPI runs in its threadpool, never on the
event loop.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, TypeVar

from draftdeck.browse.errors import BrowseError
from draftdeck.browse.tokens import TokenTable
from draftdeck.errors import InputError
from draftdeck.shards.store import ShardDataset

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MAX_OPEN_STORES = 16
MAX_TOKENIZERS = 8
MAX_MAPPED_SHARDS = 512  # memory maps a store keeps open (address space and one descriptor each)
VERSION_FILES = ("manifest.json", "state.json", "dataset_info.json")


class LoadOnce(Generic[K, V]):
    """A bounded LRU cache whose misses are loaded once: concurrent callers of one key share one load.

    A value is stored with a version; asking with another version (the files changed) loads it again.
    A load that raises is not cached: the next caller tries again, and gets its own error.
    """

    def __init__(self, load: Callable[[K], V], size: int):
        self._load = load
        self._size = size
        self._lock = threading.Lock()
        self._values: OrderedDict[K, tuple[Any, V]] = OrderedDict()
        self._flights: dict[K, threading.Lock] = {}
        self.loads = 0  # how many loads ran (for tests: N concurrent first requests make one)

    def _hit(self, key: K, version: Any) -> tuple[bool, V | None]:
        entry = self._values.get(key)
        if entry is not None and entry[0] == version:
            self._values.move_to_end(key)
            return True, entry[1]
        return False, None

    def get(self, key: K, version: Any = None) -> V:
        with self._lock:
            found, value = self._hit(key, version)
            if found:
                return value  # type: ignore[return-value]
            flight = self._flights.setdefault(key, threading.Lock())
        with flight:
            with self._lock:
                found, value = self._hit(key, version)
            if found:
                return value  # type: ignore[return-value]
            try:
                loaded = self._load(key)
                self.loads += 1
                with self._lock:
                    self._values[key] = (version, loaded)
                    self._values.move_to_end(key)
                    while len(self._values) > self._size:
                        self._values.popitem(last=False)
            finally:
                with self._lock:
                    if self._flights.get(key) is flight:
                        del self._flights[key]
        return loaded

    def forget(self, key: K) -> None:
        with self._lock:
            self._values.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


def version_of(path: Path) -> tuple[int, ...]:
    """Changes when the dataset is rewritten (the writer renames its metadata files into place)."""
    stamps = []
    for name in VERSION_FILES:
        try:
            stamps.append((path / name).stat().st_mtime_ns)
        except OSError:
            stamps.append(0)
    return tuple(stamps)


def _load_store(key: str) -> ShardDataset:
    path = Path(key)
    if not (path / "manifest.json").exists() and not (path / "state.json").exists():
        raise BrowseError(
            f"{path.name}: no manifest.json or state.json here (expected a tokenized dataset folder)"
        )
    try:
        # Keep every shard mapped (up to MAX_MAPPED_SHARDS): reopening one costs ~0.5 ms, so with the
        # reader's default LRU of 8 a random row of a 100-shard dataset would cost 10x one of 1 shard.
        store = ShardDataset.open(path, max_open=MAX_MAPPED_SHARDS)
        names = set(store.schema.names)
    except InputError as exc:
        raise BrowseError(f"{path.name}: the shards cannot be opened ({exc})") from exc
    missing = {"input_ids", "loss_mask"} - names
    if missing:
        raise BrowseError(f"{path.name}: no column {', '.join(sorted(missing))}; not a tokenized dataset")
    return store


_stores: LoadOnce[str, ShardDataset] = LoadOnce(_load_store, MAX_OPEN_STORES)


def open_store(path: Path) -> ShardDataset:
    """The reader of a dataset folder, opened once per process until its metadata files change."""
    return _stores.get(str(path), version_of(path))


def forget_store(path: Path) -> None:
    _stores.forget(str(path))
    from draftdeck.browse.info import forget_info

    forget_info(path)


_transformers_lock = threading.Lock()


def _load_table(key: str) -> TokenTable:
    """Concurrent first imports of transformers' lazy modules race ("cannot import name 'AutoTokenizer'
    from 'transformers'"), and from_pretrained imports tokenizer classes lazily too: so the import and
    the load run under one lock. Each folder loads once per process, so the lock is rarely waited on."""
    try:
        with _transformers_lock:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only: never the network
            from transformers import AutoTokenizer

            return TokenTable(AutoTokenizer.from_pretrained(key, local_files_only=True))
    except Exception as exc:  # any failure of a foreign folder is a message for the user
        raise BrowseError(f"the tokenizer at {key} cannot be loaded ({type(exc).__name__}: {exc})") from exc


_tables: LoadOnce[str, TokenTable] = LoadOnce(_load_table, MAX_TOKENIZERS)


def token_table(path: str) -> TokenTable:
    """The token table of a tokenizer folder, loaded once per process until its tokenizer.json changes."""
    tj = Path(path) / "tokenizer.json"
    try:
        version = tj.stat().st_mtime_ns
    except OSError:
        version = 0
    return _tables.get(path, version)
