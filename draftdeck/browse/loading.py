"""Shard stores and tokenizers, each loaded once per process and kept in a bounded cache.

Right after a restart, many readers ask for the same dataset at once. :class:`~draftdeck.loadonce.LoadOnce`
(the core's cache, which tokenize uses for its tokenizers too) lets the first of them load it while the
others wait for that load (single flight) instead of loading it again each, and keeps at most `size`
values, least recently used out first. Loads run in the calling thread: the
routes that call them are plain ``def`` routes, which FastAPI runs in its threadpool, never on the
event loop.
"""

from __future__ import annotations

import os
from pathlib import Path

from draftdeck.browse.errors import BrowseError
from draftdeck.browse.tokens import TokenTable
from draftdeck.chat.render import transformers_lock
from draftdeck.errors import InputError
from draftdeck.loadonce import LoadOnce
from draftdeck.shards.store import ShardDataset

MAX_OPEN_STORES = 16
MAX_TOKENIZERS = 8
MAX_MAPPED_SHARDS = 512  # memory maps a store keeps open (address space and one descriptor each)
VERSION_FILES = ("manifest.json", "state.json", "dataset_info.json")

__all__ = ["LoadOnce", "forget_store", "open_store", "token_table", "version_of"]


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
    """Drop the open reader of `path` (see :func:`draftdeck.browse.info.forget_dataset`)."""
    _stores.forget(str(path))


def _load_table(key: str) -> TokenTable:
    """Concurrent first imports of transformers' lazy modules race ("cannot import name 'AutoTokenizer'
    from 'transformers'"), and from_pretrained imports tokenizer classes lazily too: so the import and
    the load run under one lock. Each folder loads once per process, so the lock is rarely waited on."""
    try:
        with transformers_lock:
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
