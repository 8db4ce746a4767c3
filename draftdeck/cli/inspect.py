"""Showing a row's tokens in a terminal, coloured by loss mask.

Trained tokens are green, context tokens dim; token boundaries alternate two shades so adjacent
tokens can be told apart. Whitespace is made visible (space ``·``, tab ``→``, newline ``↵`` then a
real line break); special tokens are shown bold in brackets. Tokens are shown as their own bytes,
so a token holding part of a multi-byte character shows ``\\xNN`` escapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text

TRAINED = ("black on green", "black on dark_sea_green2")
CONTEXT = ("grey62", "grey50")


def visible(piece: str) -> str:
    return piece.replace(" ", "·").replace("\t", "→").replace("\r", "␍").replace("\n", "↵\n")


def token_texts(tok: Any, ids: Sequence[int]) -> list[tuple[str, bool]]:
    """(text shown, is special) per token."""
    special_ids = set(tok.all_special_ids) | {
        i for i, t in tok.added_tokens_decoder.items() if getattr(t, "special", False)
    }
    out = []
    for i in ids:
        if i in special_ids:
            out.append((f"[{tok.convert_ids_to_tokens(i)}]", True))
            continue
        raw = tok.convert_tokens_to_string([tok.convert_ids_to_tokens(i)])
        if "\ufffd" in raw:  # a partial UTF-8 sequence: show its bytes
            from draftdeck.tokenize.encoders import HFEncoder

            raw = "".join(f"\\x{b:02x}" for b in HFEncoder(tok).token_bytes(i))
        out.append((visible(raw), False))
    return out


def render_row(tok: Any, ids: Sequence[int], mask: Sequence[int]) -> Text:
    """The row's tokens; a run of an image's tokens (``<|image_pad|>``, one per merged patch) shown once,
    ``[image · N tokens]``, as the sample page draws it."""
    text = Text()
    pieces = token_texts(tok, ids)
    k = 0
    while k < len(pieces):
        (piece, special), m = pieces[k], mask[k]
        style = (TRAINED if m else CONTEXT)[k % 2]
        end = k + 1
        if special and piece == "[<|image_pad|>]":
            while end < len(pieces) and pieces[end][0] == piece:
                end += 1
            piece = f"[image · {end - k:,} tokens]"
        text.append(piece, style=f"bold {style}" if special else style)
        k = end
    return text
