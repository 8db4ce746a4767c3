"""What convert's general path makes of one row, for the tests that hold its fast path to it."""

from __future__ import annotations

from typing import Any


def general_row(
    value: Any, to: str, max_chars: int = 24, origin: tuple[str, int] | None = None
) -> tuple[str, bytes, int] | None:
    """The general path's (family, line, duplicate key) of `value`, read at `origin` (file, line; None:
    no provenance), when it keeps the row with nothing to say: what the fast path must give for the
    rows it takes. None where the general path would reject, warn, split or rename."""
    from draftdeck.convert import check_conversation, duplicate_key, placeholder_key
    from draftdeck.formats.common import ParseContext, RowRejected
    from draftdeck.formats.detect import parse
    from draftdeck.formats.model import SourceRef
    from draftdeck.formats.writers import JSONL_ENCODERS, RESERVED, encode_line

    ctx = ParseContext()
    try:
        family, convs = parse(value, ctx)
    except RowRejected:
        return None
    if len(convs) != 1 or ctx.warnings:
        return None
    conv = convs[0]
    if origin is not None:
        conv.source = SourceRef(origin[0], origin[1], 0)
    if check_conversation(conv, False) or placeholder_key(conv, max_chars) is not None:
        return None
    if not RESERVED.isdisjoint(conv.meta):
        return None
    return family, encode_line(JSONL_ENCODERS[to](conv)), duplicate_key(conv, to)
