"""What both fast paths (:mod:`draftdeck.convert.fast` and :mod:`draftdeck.convert.fast_tools`) do
with a row they take: which of its other fields they can keep, and its output line: the encoded turns
spliced with the kept fields and the provenance, the bytes
:func:`draftdeck.formats.writers.encode_line` gives the whole row, without encoding the text a
second time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from draftdeck.convert.checks import UNUSED_TEXT_CHARS
from draftdeck.formats import preference
from draftdeck.formats.model import PROVENANCE_KEY, mix_source_of, origin_of, provenance_value, repeat_of
from draftdeck.formats.writers import RESERVED, encode_line

Result = tuple[str, bytes, int | None]  # a row a fast path took: (family, output line, duplicate key)
LIST_KEY = {"sharegpt": "conversations", "openai": "messages"}  # the turns' key in each target
_HEAD = {to: b'{"' + key.encode() + b'":' for to, key in LIST_KEY.items()}  # a line's first bytes
# the provenance of a file's rows up to the row number: `,"draftdeck_source":{"file":"<file>","row":`
_PROVENANCE: dict[str, bytes] = {}
# the keys preference.pair_of needs one of: a row without any is no preference pair
_PREFERENCE_KEYS = frozenset({chosen for chosen, _ in preference.PAIRS} | {"chosen"})


def kept_fields(value: dict[str, Any], known: Sequence[str]) -> list[str] | None:
    """The fields of `value` beside its `known` keys, which the output row keeps; None where the
    general path must read the row: a field the target reserves, chosen/rejected sides (the
    preference shape) or a long text field (it says whether a reader left it unused)."""
    meta = [k for k in value if k not in known]
    if meta:
        if not RESERVED.isdisjoint(meta):
            return None
        if not _PREFERENCE_KEYS.isdisjoint(meta) and preference.pair_of(value) is not None:
            return None
        for k in meta:
            v = value[k]
            if type(v) is str and len(v) >= UNUSED_TEXT_CHARS:
                return None
    return meta


def row_line(
    body: bytes,
    out_turns: list[dict[str, Any]],
    value: dict[str, Any],
    meta: Sequence[str],
    to: str,
    origin: tuple[str, int | None],
) -> tuple[bytes, int]:
    """(the line, the repeat its kept provenance declares) of a row whose turns as written are
    `out_turns`, encoded as `body`, with the fields `meta` of `value` kept after them (orjson writes a
    dict's keys in order, so the splice is encode_line's own bytes) and `origin` (file, row) as the
    provenance, or the row's kept provenance where it has a well-formed one."""
    file, row = origin
    kept = None
    try:
        if PROVENANCE_KEY not in value:  # the usual row: its provenance is where it was read, written last
            rest = b"," + orjson.dumps({k: value[k] for k in meta})[1:-1] if meta else b""
            if file and row is not None:
                prefix = _PROVENANCE.get(file)
                if prefix is None:
                    prefix = _PROVENANCE[file] = b',"%s":{"file":%s,"row":' % (
                        PROVENANCE_KEY.encode(),
                        orjson.dumps(file),
                    )
                return b"%b%b%b%b%d}}\n" % (_HEAD[to], body, rest, prefix, row), 0
            return b"%b%b%b}\n" % (_HEAD[to], body, rest), 0
        kept = value[PROVENANCE_KEY]  # a kept provenance: the writer's own rule, in place
        kept_rest: dict[str, Any] = {k: value[k] for k in meta}
        found = origin_of(kept, file, row)
        if found is not None:
            kept_rest[PROVENANCE_KEY] = provenance_value(found, mix_source_of(kept), repeat_of(kept))
        rb = orjson.dumps(kept_rest)
        line = b"".join((_HEAD[to], body, b"," if kept_rest else b"", memoryview(rb)[1:], b"\n"))
    except orjson.JSONEncodeError:  # integers beyond 64 bits: encode_line's fallback, on the whole row
        whole: dict[str, Any] = {LIST_KEY[to]: out_turns, **{k: value[k] for k in meta}}
        found = origin_of(kept, file, row)
        if found is not None:
            whole[PROVENANCE_KEY] = provenance_value(found, mix_source_of(kept), repeat_of(kept))
        line = encode_line(whole)
    return line, repeat_of(kept)
