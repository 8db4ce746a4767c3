"""Writers: OpenAI messages JSONL, ShareGPT JSONL and Parquet, each written atomically.

Shapes written:

- ``openai``: ``{"messages": [{"role", "content", "reasoning_content"?, "tool_calls"?: [{"id"?, "type":
  "function", "function": {"name", "arguments": JSON text}}], "tool_call_id"?, "name"?, "weight"?: 0|1,
  "redacted_reasoning"?, "is_error"?, "token_ids"?}], "tools"?, ...meta}``: ``weight`` is OpenAI's
  per-message training flag, written when the source had one (ShareGPT output writes it on the turn, as
  axolotl reads it); ``token_ids`` the ids the answering model produced (regenerate), kept for tokenize
- ``sharegpt``: ``{"conversations": [{"from": system|human|gpt|tool, "value", ...same optional keys}],
  "tools"?, ...meta}``: the shape speculators and SpecForge read (a ``conversations`` column with
  ``from``/``value``). Tool calls stay structured on the ``gpt`` turn (``tool_calls``), reasoning as
  ``reasoning_content``, so the chat template renders them; nothing is folded into text.
- ``parquet``: columns ``messages`` (list of structs: role, content, reasoning, tool_calls, tool_call_id,
  name, weight, redacted_reasoning, is_error, token_ids, images), ``tools`` and ``meta`` (JSON text:
  their shapes vary per row), ``source_format``.

Images (a message's ``images``, an IMAGE_PLACEHOLDER in its text each) are stored once, content-addressed,
in ``images/`` beside the written file (:func:`draftdeck.formats.images.store`), and each format points
at them relative to the file: OpenAI writes the message's content as parts (text, then ``{"type":
"image_url", "image_url": {"url": "images/<sha256>.<ext>"}}`` where each placeholder stood); ShareGPT
keeps the placeholders and lists the images on the row (``"images": [...]``, LLaMA-Factory's shape);
Parquet keeps the placeholders and lists each message's images in its ``images`` field.

Every row says where it came from: ``draftdeck_source: {"file", "row"}`` (a top-level key in JSONL,
inside ``meta`` in Parquet; trainers ignore it), the original file and row even after several
conversions, so tokenizing a converted file still attributes each row to its original data. A row of
a mix keeps its mix source's name there too (``"source"``), through every later conversion.

Both JSONL shapes hold every field of the canonical model, so OpenAI -> ShareGPT -> OpenAI is lossless.
What a target cannot hold is counted as ``unrepresentable_field`` (and left out): a kept top-level
field (meta) whose name the target format reserves (``messages``, ``conversations``, ``tools``, ``system``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from functools import cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from draftdeck.fileio import InOrder, atomic_output, sha256_file
from draftdeck.formats.images import IMAGES_DIR, address, has_images, store
from draftdeck.formats.model import (
    IMAGE_PLACEHOLDER,
    PROVENANCE_KEY,
    Conversation,
    Message,
    SourceRef,
    ToolCall,
)
from draftdeck.quality import Output, Report

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

TARGETS = ("openai", "sharegpt", "parquet")
RESERVED = frozenset({"messages", "conversations", "tools", "system"})
SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}
_FLUSH_BYTES = 1 << 20
# Every this many bytes written, the writer's thread asks the kernel to start writing them to disk
# (posix_fadvise DONTNEED starts the writeback without waiting for it): the fsync that closes the
# file then finds little left to write, instead of the whole file (~0.07 s of a 200 MB convert).
_WRITEBACK_BYTES = 8 << 20

_PARQUET_BATCH = 2048


def arguments_text(call: ToolCall) -> str:
    if call.raw_arguments is not None:
        return call.raw_arguments
    return orjson.dumps(call.arguments).decode()


def _tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    out = []
    for c in calls:
        d: dict[str, Any] = {"id": c.id} if c.id is not None else {}
        d["type"] = "function"
        d["function"] = {"name": c.name, "arguments": arguments_text(c)}
        out.append(d)
    return out


def _message_extras(d: dict[str, Any], m: Message) -> dict[str, Any]:
    if m.reasoning is not None:
        d["reasoning_content"] = m.reasoning
    if m.tool_calls:
        d["tool_calls"] = _tool_calls(m.tool_calls)
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        d["name"] = m.name
    if m.train is not None:
        d["weight"] = int(m.train)  # OpenAI's per-message flag; axolotl reads it on ShareGPT turns
    if m.redacted_reasoning is not None:
        d["redacted_reasoning"] = m.redacted_reasoning
    if m.is_error:
        d["is_error"] = True
    if m.token_ids is not None:
        d["token_ids"] = m.token_ids
    return d


def _has_extras(m: Message) -> bool:
    return (
        m.reasoning is not None
        or bool(m.tool_calls)
        or m.tool_call_id is not None
        or m.name is not None
        or m.train is not None
        or m.redacted_reasoning is not None
        or m.is_error
        or m.token_ids is not None
    )


def meta_collision(src: SourceRef | None, key: str) -> tuple[str, str, int | None, str]:
    """The unrepresentable_field warning (code, file, line, reason) for a kept field named `key` that
    the output format reserves (the field is left out)."""
    where = src.where if src else "?"
    return (
        "unrepresentable_field",
        src.file if src else "?",
        src.line if src else None,
        f"{where}: kept field {key!r} collides with a key the output format reserves; left out",
    )


def _meta(conv: Conversation, out: dict[str, Any], report: Report | None) -> dict[str, Any]:
    for k, v in conv.meta.items():
        if k in RESERVED:
            if report is not None:
                report.warn(*meta_collision(conv.source, k))
            continue
        out[k] = v
    return out


def _record(
    conv: Conversation,
    report: Report | None,
    key: str,
    role_key: str,
    text_key: str,
    role_name: dict[str, str] | None,
) -> dict[str, Any]:
    """One output row: the turns under `key`, each `{role_key: role, text_key: text}` plus extras."""
    turns = []
    row_images: list[str] = []
    for m in conv.messages:
        d: dict[str, Any] = {role_key: role_name[m.role] if role_name else m.role, text_key: m.content}
        if m.images:
            if role_name is None:  # OpenAI: the text and images as content parts, in order
                d[text_key] = content_parts(m)
            else:  # ShareGPT: LLaMA-Factory's placeholders, the images listed on the row
                row_images.extend(address(ref) for ref in m.images)
        turns.append(_message_extras(d, m) if _has_extras(m) else d)
    out: dict[str, Any] = {key: turns}
    if conv.tools:
        out["tools"] = conv.tools
    if conv.meta:
        _meta(conv, out, report)
    if row_images:
        out["images"] = row_images
    return _with_provenance(conv, out)


def content_parts(m: Message) -> list[dict[str, Any]]:
    """A message with images as OpenAI content parts: its text split at each IMAGE_PLACEHOLDER, an
    ``image_url`` part there (the stored file, relative to the written file; see images.address)."""
    parts: list[dict[str, Any]] = []
    pieces = m.content.split(IMAGE_PLACEHOLDER)
    for i, piece in enumerate(pieces):
        if piece:
            parts.append({"type": "text", "text": piece})
        if i < len(m.images):
            parts.append({"type": "image_url", "image_url": {"url": address(m.images[i])}})
    return parts


def _with_provenance(conv: Conversation, out: dict[str, Any]) -> dict[str, Any]:
    """`out` with the original file and row (and mix source) under PROVENANCE_KEY (replacing a kept
    copy of it)."""
    value = conv.origin_record()
    if value is not None:
        out[PROVENANCE_KEY] = value
    return out


def to_openai(conv: Conversation, report: Report | None = None) -> dict[str, Any]:
    return _record(conv, report, "messages", "role", "content", None)


def to_sharegpt(conv: Conversation, report: Report | None = None) -> dict[str, Any]:
    return _record(conv, report, "conversations", "from", "value", SHAREGPT_FROM)


@cache
def parquet_schema() -> pa.Schema:
    """The Parquet output schema (pyarrow is imported only when Parquet is used)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(
                "messages",
                pa.list_(
                    pa.struct(
                        [
                            pa.field("role", pa.string()),
                            pa.field("content", pa.string()),
                            pa.field("reasoning", pa.string()),
                            pa.field(
                                "tool_calls",
                                pa.list_(
                                    pa.struct(
                                        [
                                            pa.field("id", pa.string()),
                                            pa.field("name", pa.string()),
                                            pa.field("arguments", pa.string()),
                                        ]
                                    )
                                ),
                            ),
                            pa.field("tool_call_id", pa.string()),
                            pa.field("name", pa.string()),
                            pa.field("weight", pa.int8()),
                            pa.field("redacted_reasoning", pa.string()),
                            pa.field("is_error", pa.bool_()),
                            pa.field("token_ids", pa.list_(pa.int32())),
                            pa.field("images", pa.list_(pa.string())),
                        ]
                    )
                ),
            ),
            pa.field("tools", pa.string()),
            pa.field("meta", pa.string()),
            pa.field("source_format", pa.string()),
        ],
        metadata={b"draftdeck": b"conversations/1"},  # readers undo the JSON text columns of such files
    )


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # integers beyond 64 bits
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def to_parquet_row(conv: Conversation) -> dict[str, Any]:
    meta = _with_provenance(conv, dict(conv.meta))  # a Parquet row keeps its provenance in `meta`
    return {
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments": arguments_text(c)} for c in m.tool_calls
                ],
                "tool_call_id": m.tool_call_id,
                "name": m.name,
                "weight": None if m.train is None else int(m.train),
                "redacted_reasoning": m.redacted_reasoning,
                "is_error": m.is_error or None,
                "token_ids": m.token_ids,
                "images": [address(ref) for ref in m.images] if m.images else None,
            }
            for m in conv.messages
        ],
        "tools": _json_text(conv.tools) if conv.tools else None,
        "meta": _json_text(meta) if meta else None,
        "source_format": conv.source_format,
    }


def encode_line(row: dict[str, Any]) -> bytes:
    """One JSONL row as bytes, with its newline (json for integers beyond 64 bits)."""
    try:
        return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # integers beyond 64 bits (a Parquet or Arrow file's)
        return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


JSONL_ENCODERS = {"openai": to_openai, "sharegpt": to_sharegpt}


class Writer:
    """Writes conversations to `path` atomically: the file appears only when :meth:`close` succeeds.

    Use as a context manager; an exception inside the block leaves no file behind. `output` (an
    :class:`Output` with rows, bytes and sha256) is set after a successful exit.
    """

    def __init__(self, path: Path, to: str, report: Report | None = None):
        if to not in TARGETS:
            raise ValueError(f"unknown target format {to!r}; known: {', '.join(TARGETS)}")
        self.path = path
        self.to = to
        self.report = report
        self.rows = 0
        self.output: Output | None = None
        self._ctx = atomic_output(path, "wb")
        self._f: IO[bytes] | None = None
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._hash = hashlib.sha256()
        self._bytes = 0
        self._unsynced = 0  # bytes written since the last writeback hint (see _WRITEBACK_BYTES)
        self._thread: InOrder | None = None
        self._pq: pq.ParquetWriter | None = None
        self._rows: list[dict[str, Any]] = []
        self._conv = to_openai if to == "openai" else to_sharegpt

    def __enter__(self) -> Writer:
        self._f = self._ctx.__enter__()
        if self.to == "parquet":
            import pyarrow.parquet as pq

            self._pq = pq.ParquetWriter(self._f, parquet_schema(), compression="zstd")
        return self

    def write(self, conv: Conversation) -> None:
        if has_images(conv.messages):  # stored once beside the file (already there: not read again)
            folder = self.path.parent / IMAGES_DIR
            for m in conv.messages:
                for ref in m.images:
                    store(ref, folder)
        self.rows += 1
        if self._pq is not None:
            self._rows.append(to_parquet_row(conv))
            if len(self._rows) >= _PARQUET_BATCH:
                self._flush_parquet()
            return
        line = encode_line(self._conv(conv, self.report))
        self._buf.append(line)
        self._buf_bytes += len(line)
        if self._buf_bytes >= _FLUSH_BYTES:
            self._flush()

    def write_line(self, line: bytes) -> None:
        """Append one row already encoded by :func:`encode_line` (JSONL targets; from a worker process)."""
        self.rows += 1
        self._buf.append(line)
        self._buf_bytes += len(line)
        if self._buf_bytes >= _FLUSH_BYTES:
            self._flush()

    def write_lines(self, lines: list[bytes], nbytes: int) -> None:
        """Append rows already encoded by :func:`encode_line` (`nbytes` in all): :meth:`write_line` for
        many at once."""
        self.rows += len(lines)
        self._buf.extend(lines)
        self._buf_bytes += nbytes
        if self._buf_bytes >= _FLUSH_BYTES:
            self._flush()

    def write_block(self, data: bytes | memoryview, rows: int) -> None:
        """Append `rows` rows already encoded and joined (a worker's block of lines), without a copy
        when it is large. A small block is buffered (copied) instead: each block handed to the writer's
        thread costs a hand-over, and runs of lines between two rows of another kind can be short."""
        self.rows += rows
        if len(data) < _FLUSH_BYTES // 4:
            self._buf.append(bytes(data))
            self._buf_bytes += len(data)
            if self._buf_bytes >= _FLUSH_BYTES:
                self._flush()
            return
        self._flush()
        self._emit(data)

    def _flush(self) -> None:
        if self._buf:
            data = b"".join(self._buf)
            self._buf.clear()
            self._buf_bytes = 0
            self._emit(data)

    def _emit(self, data: bytes | memoryview) -> None:
        """Hash and write `data` on the writer's thread, in order: sha256 and file writes release the
        GIL, so they overlap with the conversion (on another core). At most two blocks wait."""
        if self._thread is None:
            self._thread = InOrder("draftdeck-writer")
        self._bytes += len(data)
        self._thread.submit(self._consume, data)

    def _consume(self, data: bytes | memoryview) -> None:
        self._hash.update(data)
        assert self._f is not None
        self._f.write(data)
        self._unsynced += len(data)
        if self._unsynced >= _WRITEBACK_BYTES and hasattr(os, "posix_fadvise"):
            self._unsynced = 0
            self._f.flush()
            with contextlib.suppress(OSError):  # only a hint: the closing fsync still writes everything
                os.posix_fadvise(self._f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

    def _drain(self) -> None:
        """Wait for the blocks in flight (raising the first error) and stop the thread."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.close()

    def _flush_parquet(self) -> None:
        if self._rows:
            assert self._pq is not None
            import pyarrow as pa

            self._pq.write_table(pa.Table.from_pylist(self._rows, schema=parquet_schema()))
            self._rows.clear()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc_type is None:
            try:
                if self._pq is not None:
                    self._flush_parquet()
                    self._pq.close()
                else:
                    self._flush()
                    self._drain()
            except BaseException as err:
                with contextlib.suppress(Exception):
                    self._drain()
                self._ctx.__exit__(type(err), err, err.__traceback__)
                raise
            self._ctx.__exit__(None, None, None)
            if self._pq is not None:
                size, digest = self.path.stat().st_size, sha256_file(self.path)
            else:
                size, digest = self._bytes, self._hash.hexdigest()
            self.output = Output(str(self.path), self.rows, size, digest)
            return False
        if self._pq is not None:
            with contextlib.suppress(Exception):  # the temporary file is removed below either way
                self._pq.close()
        with contextlib.suppress(Exception):  # the file is closed and removed below either way
            self._drain()
        return bool(self._ctx.__exit__(exc_type, exc, tb))
