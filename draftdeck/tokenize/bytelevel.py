"""The byte-level BPE alphabet (GPT-2's bytes-to-unicode table): which byte each vocabulary character
stands for. One table for the fast encoder, the inspect command and the dataset pages."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """Vocabulary character -> byte; the inverse of ``transformers``' ``bytes_to_unicode``."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = printable[:]
    byte_values = printable[:]
    shifted = 0
    for b in range(256):
        if b not in printable:
            byte_values.append(b)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(c): b for b, c in zip(byte_values, chars, strict=True)}


def token_bytes(backend: Any, token_id: int) -> bytes:
    """The bytes a byte-level vocabulary entry stands for (its UTF-8 text when it is not byte-level)."""
    text = backend.id_to_token(token_id)
    if not isinstance(text, str):
        return b""
    table = byte_decoder()
    try:
        return bytes(table[c] for c in text)
    except KeyError:
        return text.encode("utf-8")


@lru_cache(maxsize=1)
def byte_translation() -> dict[int, str]:
    """A ``str.translate`` table that turns a byte-level token into its bytes as latin-1 text:
    ``token.translate(table).encode("latin-1")`` is the token's bytes, in C, without a Python loop per
    character. A character outside the alphabet becomes U+FFFF, so that the encode raises
    UnicodeEncodeError (characters above U+00FF that are not in the table stay, and raise too)."""
    table = {c: "\uffff" for c in range(256)}
    table.update({ord(ch): chr(b) for ch, b in byte_decoder().items()})
    return table


def to_bytes(token: str) -> bytes:
    """The bytes of a byte-level vocabulary entry; UnicodeEncodeError when it is not byte-level."""
    return token.translate(byte_translation()).encode("latin-1")
