"""Why a row cannot become a conversation: the exception every reader raises, and the wording of the
keys a rejection names. The lowest piece of the readers (common, images and the format readers all
raise it), so that none of them imports another to refuse a row."""

from __future__ import annotations

from typing import Any


class RowRejected(Exception):
    """The row cannot become a conversation: `code` is an issue code of draftdeck.quality."""

    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def keys_of(value: dict[str, Any], limit: int = 12) -> str:
    keys = sorted(map(str, value))
    shown = ", ".join(keys[:limit]) + (f", ... ({len(keys)} keys)" if len(keys) > limit else "")
    return shown or "(no keys)"
