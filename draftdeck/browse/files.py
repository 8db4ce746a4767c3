"""One folder's entries for the New-job form's file picker: folders first, then files, each with its
size and the kind of data it holds, detected from its name and first bytes (never by reading it
whole: a folder of 100 GB files lists as fast as one of small ones)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from draftdeck.formats.tables import COMPRESSION, CONTAINER_NAMES, DATA_SUFFIXES, container_of

MAX_ENTRIES = 500  # a folder of a million shards lists its first 500 and says how many it left out
BY_SUFFIX = {**DATA_SUFFIXES, ".jinja": "chat template", ".jinja2": "chat template"}


@dataclass(frozen=True)
class Entry:
    name: str
    path: Path
    is_dir: bool
    kind: str
    size: int | None  # bytes of a file; None for a folder


@dataclass(frozen=True)
class Listing:
    folder: Path
    entries: list[Entry]
    left_out: int  # entries beyond MAX_ENTRIES


def folder_kind(path: Path) -> str:
    """What a folder holds, by the files that mark it."""
    if (path / "manifest.json").is_file():
        return "tokenized dataset"
    if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():
        return "HF dataset (save_to_disk)"
    if (path / "tokenizer.json").is_file():
        return "model / tokenizer" if (path / "config.json").is_file() else "tokenizer"
    if (path / "config.json").is_file():
        return "model"
    return "folder"


def file_kind(path: Path) -> str:
    """The data format of a file: by its suffix (under gzip/zstd), else by its first bytes."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    compression = COMPRESSION.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    kind = BY_SUFFIX.get(suffixes[-1]) if suffixes else None
    if kind is None and compression is None:
        kind = _sniff(path)
    if kind is None:
        kind = "data" if compression else "other"
    return f"{kind}, {compression}" if compression else kind


def _sniff(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    container = container_of(head)
    if container is not None:
        return CONTAINER_NAMES[container]
    text = head.lstrip()
    if text.startswith(b"["):
        return "JSON"
    if text.startswith(b"{"):
        return "JSONL"
    return None


def list_folder(folder: Path) -> Listing:
    """The entries of `folder` (hidden ones left out), folders first, each group by name. OSError when
    the folder cannot be read."""
    folders: list[Entry] = []
    files: list[Entry] = []
    with os.scandir(folder) as it:
        items = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name.lower())
    left_out = max(0, len(items) - MAX_ENTRIES)
    for e in items[:MAX_ENTRIES]:
        path = Path(e.path)
        try:
            if e.is_dir():
                folders.append(Entry(e.name, path, True, folder_kind(path), None))
            else:
                files.append(Entry(e.name, path, False, file_kind(path), e.stat().st_size))
        except OSError:  # a dangling link or a file removed meanwhile: listed, as unreadable
            files.append(Entry(e.name, path, False, "unreadable", None))
    return Listing(folder, folders + files, left_out)
