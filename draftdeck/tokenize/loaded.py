"""The tokenizers this process has loaded, kept across jobs (a worker's pool process runs many).

Loading is most of a small job's time: the HF fast tokenizer of a 248k vocabulary takes seconds, and
its tiktoken tables about as long again. So each process loads a tokenizer once and keeps it in a
bounded single-flight cache (:class:`~draftdeck.loadonce.LoadOnce`), keyed by a fingerprint of what
the load reads (the tokenizer's files, the chat-template file that replaces its template, the encoder
choice): a second job with the same tokenizer, in any folder, does not load it again, and a tokenizer
whose files changed is loaded afresh. The template kwargs are not part of the key: they only change
the renderer, which is cheap and built per job.

The CLI loads before it forks its process pool, so the pool's processes share the parent's copy.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftdeck.chat.render import TOKENIZER_FILES, load_tokenizer, transformers_lock
from draftdeck.errors import InputError, UsageError
from draftdeck.loadonce import LoadOnce
from draftdeck.tokenize.encoders import EncoderUnsupported, HFEncoder, TiktokenEncoder

# A 248k-vocabulary tokenizer with its tiktoken tables holds ~0.5 GB: two (the current job's and the
# one before) let a worker alternate between two models without keeping more.
MAX_TOKENIZERS = 2


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
            fast = TiktokenEncoder(tok)
        except EncoderUnsupported as exc:
            if key.encoder == "tiktoken":
                raise UsageError(f"the tiktoken encoder cannot run this tokenizer: {exc}") from exc
            note = f"tiktoken not used: {exc}"
    return LoadedTokenizer(tok, HFEncoder(tok), fast, note, time.perf_counter() - started)


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
    in; tiktoken; datasets, whose features define the shards' schema): a worker's main process calls
    this before it forks its pool, so each pool process starts its first job with them imported
    (copy-on-write) instead of importing them itself."""
    with transformers_lock:
        import datasets  # noqa: F401
        import tiktoken  # noqa: F401
        from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401
        from transformers.models.auto import tokenization_auto  # noqa: F401
