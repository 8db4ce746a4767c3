"""Finding a dataset's tokenizer again, on another machine or from another folder.

A manifest records the tokenizer's folder (absolute since the tokenizer reference was resolved;
older ones hold it as typed, e.g. ``data/models/qwen36tok`` relative to wherever the CLI ran) and
its fingerprint: sha256 over the tokenizer files, the chat template and the template kwargs
(:func:`draftdeck.chat.render.tokenizer_fingerprint`). The manifest keeps the template text and the
kwargs too, so any candidate folder's fingerprint can be computed and compared. Lookup order:

1. the recorded folder, when it is absolute and present;
2. a relative recorded folder from the dataset folder and each of its parents (a dataset under
   ``var/datasets/x`` tokenized with ``data/models/t`` from the project folder finds
   ``<project>/data/models/t``), then from each search root;
3. a fingerprint match among the tokenizer folders under the search roots (the data roots, for the
   app), visited breadth-first up to a few levels and a bounded number of folders.

A folder found by its path is used as it is (the fingerprint is the trainer's check, not the
browser's); one found by search must match the fingerprint exactly.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from draftdeck.shards.manifest import Manifest

SEARCH_DEPTH = 4  # root/models/org/name: deep enough for the usual layouts
SEARCH_MAX_FOLDERS = 5_000  # a root holding a million folders costs a bounded walk, not minutes
# Folders that hold outputs, not tokenizers: dataset shards, the broker's message files, VCS data.
SKIP_NAMES = frozenset({"broker", "node_modules", "__pycache__"})


def find_tokenizer(manifest: Manifest, dataset_dir: Path, roots: Iterable[Path] = ()) -> Path | None:
    """The tokenizer folder of the dataset at `dataset_dir` on this machine, or None (see module)."""
    ref = manifest.tokenizer
    if ref is None:
        return None
    search_roots = tuple(Path(r).resolve() for r in roots)
    if ref.path:
        recorded = Path(ref.path).expanduser()
        if recorded.is_absolute():
            if recorded.is_dir():
                return recorded.resolve()
        else:
            bases = [Path(dataset_dir).resolve(), *Path(dataset_dir).resolve().parents, *search_roots]
            for base in bases:
                if (base / recorded).is_dir():
                    return (base / recorded).resolve()
    if ref.chat_template is None or not search_roots:
        return None  # nothing to fingerprint a candidate with (a pre-tokenized set without a template)
    kwargs = manifest.parameters.get("template_kwargs") or {}
    return _by_fingerprint(ref.fingerprint, ref.chat_template, _frozen(kwargs), search_roots)


def tokenizer_folders(roots: Sequence[Path]) -> list[Path]:
    """Folders holding a ``tokenizer.json`` under `roots`, breadth-first and bounded."""
    found: list[Path] = []
    queue: deque[tuple[Path, int]] = deque((r, 0) for r in roots)
    seen = 0
    while queue and seen < SEARCH_MAX_FOLDERS:
        folder, depth = queue.popleft()
        seen += 1
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        if any(e.name == "tokenizer.json" and e.is_file() for e in entries):
            found.append(folder)
            continue  # a tokenizer folder's subfolders are not other tokenizers
        if depth >= SEARCH_DEPTH:
            continue
        for e in sorted(entries, key=lambda e: e.name):
            if e.is_dir(follow_symlinks=False) and not e.name.startswith(".") and e.name not in SKIP_NAMES:
                queue.append((Path(e.path), depth + 1))
    return found


def _frozen(kwargs: Any) -> str:
    return json.dumps(kwargs, sort_keys=True)


# Hits are kept (re-checked on use: the folder must still be there); a miss is kept for a minute, so
# a page view does not re-hash every tokenizer under the roots, yet a tokenizer copied in is found.
MISS_SECONDS = 60.0
_found: dict[tuple[str, str, str, tuple[Path, ...]], Path] = {}
_missed: dict[tuple[str, str, str, tuple[Path, ...]], float] = {}
_lock = threading.Lock()


def _by_fingerprint(
    fingerprint: str, template: str, kwargs_json: str, roots: tuple[Path, ...]
) -> Path | None:
    from draftdeck.chat.render import tokenizer_fingerprint

    key = (fingerprint, template, kwargs_json, roots)
    with _lock:
        hit = _found.get(key)
        if hit is not None and hit.is_dir():
            return hit
        if time.monotonic() - _missed.get(key, -MISS_SECONDS) < MISS_SECONDS:
            return None
    kwargs = json.loads(kwargs_json)
    match = next(
        (
            f.resolve()
            for f in tokenizer_folders(roots)
            if tokenizer_fingerprint(f, template, kwargs) == fingerprint
        ),
        None,
    )
    with _lock:
        if match is None:
            _missed[key] = time.monotonic()
        else:
            _found[key] = match
            _missed.pop(key, None)
    return match


def clear_cache() -> None:
    """Forget earlier fingerprint searches (a tokenizer was added or moved)."""
    with _lock:
        _found.clear()
        _missed.clear()
