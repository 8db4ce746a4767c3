"""The tokenizers this process has loaded, kept across jobs (a worker's pool process runs many).

Loading is most of a small job's time: the HF fast tokenizer of a 248k vocabulary takes seconds, and
its tiktoken tables about as long again. So each process loads a tokenizer once and keeps it in a
bounded single-flight cache (:class:`~draftdeck.loadonce.LoadOnce`), keyed by a fingerprint of what
the load reads (the tokenizer's files, the chat-template file that replaces its template, the encoder
choice): a second job with the same tokenizer, in any folder, does not load it again, and a tokenizer
whose files changed is loaded afresh. The template kwargs are not part of the key: they only change
the renderer, which is cheap and built per job.

The CLI loads before it forks its process pool, so the pool's processes share the parent's copy.
Across processes, the tiktoken tables (checked against the tokenizer's structure once) are saved in a
cache folder (:func:`tables_folder`) keyed by the same fingerprint and the libraries' versions: a
later process restores them instead of building and checking them again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftdeck.chat.render import TOKENIZER_FILES, load_tokenizer, transformers_lock
from draftdeck.errors import InputError, UsageError
from draftdeck.fileio import atomic_output
from draftdeck.loadonce import LoadOnce
from draftdeck.tokenize.encoders import EncoderUnsupported, HFEncoder, TiktokenEncoder

TABLES_VERSION = "1"  # of the saved tiktoken tables' layout (TiktokenEncoder.state)
# A 248k-vocabulary tokenizer with its tiktoken tables holds ~0.5 GB: two (the current job's and the
# one before) let a worker alternate between two models without keeping more.
MAX_TOKENIZERS = 2
# tiktoken tables files kept under tables_folder(), the least recently used removed first (~4 MiB each
# for a 248k vocabulary)
MAX_TABLES_FILES = 16


@dataclass(frozen=True)
class TokenizerKey:
    """What a load depends on. Equal fingerprints mean equal files, so the path is not compared."""

    fingerprint: str
    encoder: str
    path: str = field(compare=False)
    chat_template: str | None = field(compare=False)


@dataclass
class LoadedTokenizer:
    tok: Any
    hf: HFEncoder
    fast: TiktokenEncoder | None
    note: str  # why the fast encoder is not used ("" when it is, or was not asked for)
    seconds: float  # how long the load took


def key_for(tokenizer: Path | str, chat_template: Path | str | None, encoder: str) -> TokenizerKey:
    """The cache key: sha256 over the tokenizer's files and the template file (read, not stat'ed: a
    copy in another folder is the same tokenizer, and a rewrite with the same mtime is not)."""
    h = hashlib.sha256()
    folder = Path(tokenizer)
    for name in TOKENIZER_FILES:
        f = folder / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    if chat_template is not None:
        try:
            h.update(b"template\0" + Path(chat_template).read_bytes())
        except OSError as exc:
            raise InputError(f"cannot read chat template {chat_template}: {exc}") from exc
    return TokenizerKey(h.hexdigest(), encoder, str(tokenizer), str(chat_template) if chat_template else None)


def _load(key: TokenizerKey) -> LoadedTokenizer:
    started = time.perf_counter()
    tok = load_tokenizer(key.path, key.chat_template)
    fast: TiktokenEncoder | None = None
    note = ""
    if key.encoder in ("auto", "tiktoken"):
        try:
            fast = _fast_encoder(tok, key)
        except EncoderUnsupported as exc:
            if key.encoder == "tiktoken":
                raise UsageError(f"the tiktoken encoder cannot run this tokenizer: {exc}") from exc
            note = f"tiktoken not used: {exc}"
    return LoadedTokenizer(tok, HFEncoder(tok), fast, note, time.perf_counter() - started)


def tables_folder() -> Path:
    """Where the checked tiktoken tables of tokenizers are kept between processes:
    ``$DRAFTDECK_CACHE``, else ``$XDG_CACHE_HOME/draftdeck``, else ``~/.cache/draftdeck``."""
    root = os.environ.get("DRAFTDECK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "draftdeck"
    )
    return Path(root) / "tiktoken"


def _tables_file(key: TokenizerKey) -> Path:
    """The tables depend on the tokenizer's files and on the libraries that read them."""
    import tiktoken
    import tokenizers
    import transformers

    versions = f"{TABLES_VERSION}:{tiktoken.__version__}:{tokenizers.__version__}:{transformers.__version__}"
    return tables_folder() / (
        hashlib.sha256(f"{versions}:{key.fingerprint}".encode()).hexdigest()[:32] + ".npz"
    )


def _fast_encoder(tok: Any, key: TokenizerKey) -> TiktokenEncoder:
    """The tiktoken encoder, restored from the tables an earlier process checked and saved for the same
    files (~0.3 s instead of ~1.5 s for a 248k vocabulary: most of a command's start-up beyond the HF
    load), else built and checked here and saved for the next process. A missing, damaged or unwritable
    file only means building it here; every job still checks a sample of rows against HF."""
    path = _tables_file(key)
    global table_builds
    try:
        with np.load(path, allow_pickle=False) as saved:
            restored = TiktokenEncoder.restore({name: saved[name] for name in saved.files})
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the bound below removes the least recently used files first
        return restored
    except Exception:  # absent, or not a file this version wrote: build it
        pass
    fast = TiktokenEncoder(tok)
    table_builds += 1
    # a read-only cache folder: no cache, the same encoder
    with contextlib.suppress(OSError):
        with atomic_output(path) as f:
            np.savez(f, **fast.state())  # type: ignore[arg-type]  # numpy's stub types the first keyword
        prune_tables(path.parent, MAX_TABLES_FILES)
    return fast


def prune_tables(folder: Path, keep: int) -> list[Path]:
    """Remove all but the `keep` most recently used tables files of `folder` (a few MiB each: one per
    tokenizer and library versions, so upgrades and many tokenizers would pile up); the removed."""
    files = sorted(folder.glob("*.npz"), key=lambda f: f.stat().st_mtime, reverse=True)
    removed = []
    for f in files[keep:]:
        with contextlib.suppress(OSError):
            f.unlink()
            removed.append(f)
    return removed


table_builds = 0  # tiktoken tables built (not restored) in this process: tests count them
_cache: LoadOnce[TokenizerKey, LoadedTokenizer] = LoadOnce(_load, MAX_TOKENIZERS)


def load(
    tokenizer: Path | str, chat_template: Path | str | None, encoder: str
) -> tuple[LoadedTokenizer, bool]:
    """The loaded tokenizer and whether this call loaded it (False: this process already had it)."""
    return _cache.lookup(key_for(tokenizer, chat_template, encoder))


def loads() -> int:
    """How many tokenizer loads this process has run (tests count them; reports say per job)."""
    return _cache.loads


def forget_all() -> None:
    """Drop every kept tokenizer (tests that need a cold process)."""
    _cache.clear()


def preload_imports() -> None:
    """Import what a tokenize job imports (transformers' tokenizer classes, and the torch they pull
    in; tiktoken; not datasets, which writing shards does not need): a worker's main process calls
    this before it forks its pool, so each pool process starts its first job with them imported
    (copy-on-write) instead of importing them itself."""
    with transformers_lock:
        import tiktoken  # noqa: F401
        from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401
        from transformers.models.auto import tokenization_auto  # noqa: F401
