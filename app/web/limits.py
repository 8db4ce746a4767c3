"""What a request may carry, checked before any route runs, so that bad input is a 4xx, never a 500.

- Bodies: at most 1 MiB (job parameters and forms are small; nothing here uploads files). A declared
  Content-Length over it is answered 413 before a byte of the body is read; a chunked body is cut
  off as soon as it passes the limit.
- Text: no NUL byte (PostgreSQL refuses it in text and JSON, the OS in paths) and no lone surrogate
  (it cannot be written as UTF-8) in the path, the query, a form or a JSON body: 400 naming where.
- Whole numbers in the URL: ids are 32-bit on PostgreSQL and SQLite's driver overflows at 64 bits,
  so a number above 2^31-1 in a path segment is 404 (no such thing) and in the query 422.
- Log lines: `cap_log_lines` cuts every log message and traceback line to a few KiB, so no request
  can write its body (or a 50 MB parameter echoed in an exception) into one line of the log.
"""

from __future__ import annotations

import json
import logging
import re
import traceback
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1 << 20
DRAIN_BYTES = 16 << 20  # what of a refused body is read (and dropped) so its client hears the 413
MAX_ID = 2**31 - 1
# Query parameters that are chart coordinates, not ids: epoch milliseconds and token counts pass 2^31
# (a zoom on a run's time or tokens axis); they stay within a 64-bit column.
COORDINATES = frozenset({"lo", "hi"})
MAX_COORDINATE = 2**62
MAX_LOG_LINE_CHARS = 4000
MAX_TRACEBACK_CHARS = 20000
_WHOLE_NUMBER = re.compile(r"[+-]?\d+")


class Rejected(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def text_problem(text: str) -> str | None:
    """What makes `text` unusable as stored or path text, or None."""
    if "\x00" in text:
        return "contains a NUL byte"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


def out_of_range(text: str, limit: int = MAX_ID) -> bool:
    """`text` is a whole number beyond `limit` (by default what any id column or row index holds)."""
    if not _WHOLE_NUMBER.fullmatch(text):
        return False
    digits = text.lstrip("+-")
    # Compare lengths first: int() refuses strings of over 4300 digits, and we need no such number.
    return len(digits) > len(str(limit)) or int(digits) > limit


def json_problem(value: Any) -> str | None:
    """The first string (key or value) in a decoded JSON document that `text_problem` refuses, as
    "<where>: <problem>", walking iteratively (a deep document cannot exhaust the stack)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return f"{where or 'the JSON body'} {problem}"
        elif isinstance(item, dict):
            for key, sub in item.items():
                problem = text_problem(key)
                if problem:
                    return f"a key in {where or 'the JSON body'} {problem}"
                stack.append((f"{where}.{key}" if where else key, sub))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", sub) for i, sub in enumerate(item))
    return None


def check_url(scope: Scope) -> None:
    """Raise Rejected for a path or query the routes must not see."""
    path = scope.get("path", "")
    problem = text_problem(path)
    if problem:
        raise Rejected(400, f"the URL path {problem}")
    for segment in path.split("/"):
        if out_of_range(segment):
            raise Rejected(404, f"nothing has the number {segment[:40]}: ids go up to {MAX_ID}")
    query = scope.get("query_string", b"").decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True):
        for part, text in (("name", name), ("value", value)):
            problem = text_problem(text)
            if problem:
                raise Rejected(400, f"a query parameter {part} {problem}")
        limit = MAX_COORDINATE if name in COORDINATES else MAX_ID
        if out_of_range(value, limit):
            raise Rejected(422, f"query parameter {name[:40]!r}: {value[:40]} is above {limit}")


def check_body(body: bytes, content_type: str) -> None:
    """Raise Rejected for a body no route can use. An undecodable JSON body passes: the route's
    own validation answers it 422 with the position of the error."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        try:
            document = json.loads(body)
        except RecursionError:
            raise Rejected(400, "the JSON body is nested too deeply") from None
        except ValueError:
            return
        problem = json_problem(document)
        if problem:
            raise Rejected(400, problem)
        return
    if b"\x00" in body or (kind == "application/x-www-form-urlencoded" and b"%00" in body):
        raise Rejected(400, "the request body contains a NUL byte")


class RequestLimits:
    """ASGI middleware applying the limits above; the body is buffered (it is small by then) and
    replayed to the app, and messages after it (a disconnect) pass straight through."""

    def __init__(self, app: ASGIApp, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        try:
            check_url(scope)
            if declared is not None:
                if not declared.isdigit():
                    raise Rejected(400, f"Content-Length {declared[:40]!r} is not a number")
                if int(declared) > self.max_body:
                    raise self._too_large()
            elif "transfer-encoding" not in headers:
                await self.app(scope, receive, send)  # no body
                return
            body = await self._read(receive)
            check_body(body, headers.get("content-type", ""))
        except Rejected as exc:
            if exc.status == 413 and declared is not None and declared.isdigit():
                await self._drain(receive, int(declared))
            await reply(send, exc.status, exc.message)
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Rejected(400, "the client went away before sending its body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _drain(self, receive: Receive, declared: int) -> None:
        """Read and drop a declared body too large to take when it is at most DRAIN_BYTES: a client
        that writes its whole body before it reads the answer (urllib, the run reporter) would
        otherwise meet a closed connection mid-write (a reset, not the 413) and could only retry.
        A larger declared body, or one of undeclared length, is not read: the connection closes."""
        if declared > DRAIN_BYTES:
            return
        drained = 0
        while drained < declared:
            message = await receive()
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    def _too_large(self) -> Rejected:
        return Rejected(413, f"the request body is over {self.max_body:,} bytes")


async def reply(send: Send, status: int, message: str) -> None:
    body = json.dumps({"detail": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The body may be unread: make the server close rather than parse it as a next request.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit:,} characters cut]"


def _cut_arg(value: Any, limit: int) -> Any:
    if isinstance(value, (int, float)):
        return value  # short, and %d or %.1f in the format still need a number
    text = value if isinstance(value, str) else str(value)
    return _cut(text, limit) if len(text) > limit else value


def cap_log_lines(line_chars: int = MAX_LOG_LINE_CHARS, traceback_chars: int = MAX_TRACEBACK_CHARS) -> None:
    """Cut every log record's message, and each line of its traceback, to `line_chars` (and the
    traceback to its last `traceback_chars`), for every logger of this process. Idempotent."""
    current = logging.getLogRecordFactory()
    if getattr(current, "draftdeck_capped", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = current(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging itself reports it when the record is emitted
            return record
        if len(message) > line_chars:
            # Cut the arguments, not the shape: formatters such as uvicorn's access log read
            # record.args as the tuple the call passed.
            if isinstance(record.msg, str) and len(record.msg) > line_chars:
                record.msg = _cut(record.msg, line_chars)
            if isinstance(record.args, tuple):
                record.args = tuple(_cut_arg(a, line_chars) for a in record.args)
            elif isinstance(record.args, dict):
                record.args = {k: _cut_arg(v, line_chars) for k, v in record.args.items()}
        if record.exc_info and record.exc_info[0] is not None:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            lines = "\n".join(_cut(line, line_chars) for line in text.split("\n"))
            if len(lines) > traceback_chars:
                lines = f"[{len(lines) - traceback_chars:,} characters cut]...{lines[-traceback_chars:]}"
            record.exc_text = lines  # formatters print exc_text when set instead of formatting again
        return record

    capped: Callable[..., logging.LogRecord] = factory
    capped.draftdeck_capped = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(capped)
