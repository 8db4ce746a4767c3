"""Helpers every format family shares: row-level issues, content parts, tool calls, `<think>` blocks.

A family parser turns one JSON object into one or more :class:`Conversation` values. It raises
:class:`RowRejected` (an issue code and a reason) when the row cannot become a conversation, and
records row-level warnings (kept rows) in a :class:`ParseContext`, so the caller counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from draftdeck.formats.images import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    image_part,
)
from draftdeck.formats.model import IMAGE_PLACEHOLDER, ImageRef, Message, ToolCall
from draftdeck.formats.rejected import RowRejected, keys_of  # noqa: F401 (every reader imports them here)

IMAGE_MODES = ("keep", "reject")


@dataclass
class ParseOptions:
    """What a family parser may need to know. `tree_paths`: "all" (one conversation per leaf) or "best";
    `from_format`: a shape name of draftdeck.formats.detect that every row must have (None: detect);
    `tool_tags`: "parse" (Hermes ``<tool_call>`` / ``<tool_response>`` text becomes structured calls
    and tool messages) or "keep" (it stays text); `preference`: "chosen" (a preference row becomes its
    chosen conversation) or "reject"; `columns` / `tags`: a declared mapping that reads every row."""

    tree_paths: str = "all"
    from_format: str | None = None
    tool_tags: str = "parse"
    preference: str = "chosen"
    # a declared mapping (draftdeck.formats.columns), as (key, field) pairs: it reads every row
    columns: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    # images in the rows (draftdeck.formats.image_parts): "keep" reads and checks them, "reject" refuses
    # the row as multimodal_content (what a text-only target takes); the limits of one image; where to
    # store them (None: checked, not stored); the folders image files may be read from (None: any)
    images: str = "keep"
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    images_dir: str | None = None
    image_roots: tuple[str, ...] | None = None


class ParseContext:
    """Collects the warnings of one input row: (code, reason) pairs, each code counted once per row.
    `base_dir`: the input file's folder, which the row's relative image paths are relative to (None:
    the working directory); `images`: set when a reader met an image, so the row's are checked."""

    __slots__ = ("base_dir", "images", "options", "warnings")

    def __init__(self, options: ParseOptions | None = None, base_dir: str | None = None):
        self.options = options if options is not None else ParseOptions()
        self.warnings: dict[str, str] = {}
        self.base_dir = base_dir
        self.images = False

    def warn(self, code: str, reason: str) -> None:
        self.warnings.setdefault(code, reason)


# Role names every reader maps (OpenAI `role`, ShareGPT `from`, Gemini `role`): what exporters write
# for the three parties besides the canonical names.
ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "ai": "assistant",
    "chatbot": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
    "observation": "tool",
}


# -- text and parts --------------------------------------------------------------------------------
_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


def split_think(text: str) -> tuple[str | None, str]:
    """Split a leading ``<think>...</think>`` block off assistant text: (reasoning, rest).

    Only a block at the start (after whitespace) counts; text without a complete block is returned
    unchanged with reasoning None.
    """
    if _THINK_OPEN not in text:
        return None, text
    stripped = text.lstrip()
    if not stripped.startswith(_THINK_OPEN):
        return None, text
    end = stripped.find(_THINK_CLOSE)
    if end < 0:
        return None, text
    reasoning = stripped[len(_THINK_OPEN) : end].strip("\n")
    rest = stripped[end + len(_THINK_CLOSE) :].lstrip("\n")
    return reasoning, rest


def text_of(value: Any, where: str, ctx: ParseContext) -> str:
    """A field that should hold text: str as is, None as "", numbers as their JSON text."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool | int | float):
        return orjson.dumps(value).decode()
    raise RowRejected("unknown_format", f"{where} is a JSON {type(value).__name__}, not text")


@dataclass
class Parts:
    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    images: list[ImageRef] = field(default_factory=list)  # one IMAGE_PLACEHOLDER in `text` each


# image, image_url, input_image, audio, input_audio, video, video_url... (OpenAI, torchtune, HF)
MEDIA_PART_PREFIXES = ("image", "input_image", "audio", "input_audio", "video", "input_video")
IMAGE_PART_PREFIXES = ("image", "input_image")


def parse_content(content: Any, where: str, ctx: ParseContext) -> Parts:
    """OpenAI-style content: a string, None, or a list of typed parts.

    Part types: ``text`` (``text`` or ``value``), ``reasoning``/``thinking`` (to reasoning),
    ``tool_call`` (a call as JSON text or object). Bare strings in the list are text. Image parts
    become the message's images, each an IMAGE_PLACEHOLDER in the text where it stood
    (:mod:`draftdeck.formats.image_parts`; with ``images="reject"`` they reject the row as
    multimodal_content, as audio and video parts always do: no drafter here learns from them); any
    other part would be lost: ``lost_part``, which rejects the row unless a policy says otherwise.
    """
    if isinstance(content, str):
        return Parts(content)
    if content is None:
        return Parts("")
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        raise RowRejected("unknown_format", f"{where}.content is a JSON {type(content).__name__}")
    parts = Parts()
    texts: list[str] = []
    reasons: list[str] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise RowRejected("unknown_format", f"{where}.content[{i}] is a JSON {type(part).__name__}")
        kind = part.get("type", "text")
        if kind in ("text", "input_text", "output_text"):
            texts.append(text_of(part.get("text", part.get("value")), f"{where}.content[{i}]", ctx))
        elif kind in ("reasoning", "thinking"):
            reasons.append(
                text_of(part.get("text", part.get("value", part.get(kind))), f"{where}.content[{i}]", ctx)
            )
        elif kind in ("tool_call", "function_call"):
            raw = part.get("value", part.get("tool_call", part.get("function")))
            parts.tool_calls.extend(parse_tool_call_value(raw, f"{where}.content[{i}]", ctx))
        elif isinstance(kind, str) and kind.startswith(IMAGE_PART_PREFIXES) and ctx.options.images == "keep":
            parts.images.append(image_part(part, kind, f"{where}.content[{i}]", ctx))
            texts.append(IMAGE_PLACEHOLDER)
        elif isinstance(kind, str) and kind.startswith(MEDIA_PART_PREFIXES):
            raise RowRejected(
                "multimodal_content",
                f"{where}.content[{i}] is a {kind!r} part; no drafter here learns from it"
                + (" (images are refused: --images reject)" if kind.startswith(IMAGE_PART_PREFIXES) else ""),
            )
        else:
            ctx.warn("lost_part", f"{where}.content[{i}] is a {kind!r} part, which no reader keeps")
    parts.text = "".join(texts)
    if reasons:
        parts.reasoning = "\n".join(reasons)
    return parts


# -- tool calls ------------------------------------------------------------------------------------
def parse_arguments(raw: Any, where: str, ctx: ParseContext) -> tuple[Any, str | None]:
    """(arguments, raw_arguments): JSON text is parsed; text that is not JSON is kept as raw text."""
    if isinstance(raw, str):
        try:
            return orjson.loads(raw), None
        except orjson.JSONDecodeError as exc:
            ctx.warn("invalid_tool_arguments", f"{where}: arguments are not valid JSON ({exc}); kept as text")
            return None, raw
    return raw, None


def tool_call_from_dict(d: dict[str, Any], where: str, ctx: ParseContext) -> ToolCall:
    """An OpenAI tool call ({id, type, function: {name, arguments}}) or a flat {name, arguments}."""
    fn = d.get("function")
    body = fn if isinstance(fn, dict) else d
    name = body.get("name")
    if not isinstance(name, str):
        ctx.warn("invalid_tool_arguments", f"{where}: tool call without a name")
        name = "" if name is None else str(name)
    args, raw = parse_arguments(body.get("arguments", body.get("parameters")), where, ctx)
    call_id = d.get("id")
    return ToolCall(
        name=name, arguments=args, raw_arguments=raw, id=call_id if isinstance(call_id, str) else None
    )


def parse_tool_call_value(raw: Any, where: str, ctx: ParseContext) -> list[ToolCall]:
    """One call or a list of calls, as JSON text or JSON values (ShareGPT function_call, typed parts)."""
    value = raw
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            ctx.warn("invalid_tool_arguments", f"{where}: tool call is not valid JSON; kept as text")
            return [ToolCall(name="", arguments=None, raw_arguments=raw)]
    items = value if isinstance(value, list) else [value]
    calls: list[ToolCall] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            ctx.warn("invalid_tool_arguments", f"{where}[{i}]: tool call is a JSON {type(item).__name__}")
            calls.append(ToolCall(name="", arguments=None, raw_arguments=orjson.dumps(item).decode()))
            continue
        calls.append(tool_call_from_dict(item, where, ctx))
    return calls


def parse_tools(value: Any, where: str, ctx: ParseContext) -> list[dict[str, Any]]:
    """Top-level tool definitions: a list, or a JSON string of a list (often ``"[]"``)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            ctx.warn("lost_tools", f"{where} is text that is not JSON: the tool definitions cannot be read")
            return []
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        ctx.warn("lost_tools", f"{where} is not a list of tool objects: the definitions cannot be read")
        return []
    return value


class TurnBuilder:
    """Collects the blocks of one source message (text, reasoning, tool calls) into canonical
    messages, in order: a tool result among them (Anthropic's ``tool_result`` blocks, Gemini's
    ``functionResponse`` parts) ends the message so far and follows it as its own tool message."""

    def __init__(self, role: str):
        self.role = role
        self.out: list[Message] = []
        self._start()

    def _start(self) -> None:
        self.current = Message(self.role)  # type: ignore[arg-type]
        self.texts: list[str] = []
        self.reasons: list[str] = []

    def result(self, tool: Message) -> None:
        self.flush()
        self.out.append(tool)

    def flush(self) -> None:
        msg = self.current
        msg.content = "".join(self.texts)
        if self.reasons:
            msg.reasoning = "\n".join(self.reasons)
        if not msg.is_empty or msg.redacted_reasoning is not None:
            self.out.append(finish_assistant(msg))
        self._start()

    def messages(self, train: bool | None) -> list[Message]:
        """The messages built, each with the source message's training flag; an empty source message
        stays one empty message, for the checks to name."""
        self.flush()
        for m in self.out:
            m.train = train
        return self.out or [Message(self.role)]  # type: ignore[arg-type]


def finish_assistant(msg: Message) -> Message:
    """Move a leading ``<think>`` block of assistant text into reasoning (when reasoning is unset)."""
    if msg.role == "assistant" and msg.reasoning is None and "<think>" in msg.content:
        reasoning, rest = split_think(msg.content)
        if reasoning is not None:
            msg.reasoning = reasoning
            msg.content = rest
    return msg


def reasoning_of(d: dict[str, Any], where: str, ctx: ParseContext) -> str | None:
    value = d.get("reasoning_content")
    if value is None:
        value = d.get("reasoning")
    if value is None:
        value = d.get("thinking")
    if value is None or value == "":
        return None
    return text_of(value, f"{where}.reasoning_content", ctx)


# -- per-turn training flags -----------------------------------------------------------------------
TRAIN_FLAG_KEYS = ("weight", "loss", "loss_weight", "train")
# a message's fields beyond its role, text, reasoning and tool calls (read by `read_extras`)
EXTRA_KEYS = ("redacted_reasoning", "is_error", "token_ids", *TRAIN_FLAG_KEYS)


def read_extras(d: dict[str, Any], msg: Message, where: str, ctx: ParseContext) -> None:
    """Set `msg`'s training flag, redacted reasoning, error mark and token ids from message `d`."""
    msg.train = train_flag(d, where, ctx)
    if d.get("redacted_reasoning") is not None:
        msg.redacted_reasoning = text_of(d["redacted_reasoning"], f"{where}.redacted_reasoning", ctx)
    msg.is_error = d.get("is_error") is True
    ids = d.get("token_ids")
    if ids is None:
        return
    if msg.role == "assistant" and isinstance(ids, list) and all(type(t) is int and t >= 0 for t in ids):
        msg.token_ids = ids
    else:
        ctx.warn("unrepresentable_field", f"{where}.token_ids is not the token ids of an answer; left out")


def train_flag(d: dict[str, Any], where: str, ctx: ParseContext) -> bool | None:
    """A message's training flag: OpenAI's and axolotl's ``weight`` (0 or 1), xtuner's ``loss`` and
    axolotl's ``train`` (booleans), LLaMA-Factory's ``loss_weight`` (a number; 0 is untrained). None
    when the message has none. A value none of them allows is ``invalid_train_flag``; a fractional
    ``loss_weight`` trains the turn (masks are 0 or 1) under ``partial_loss_weight``."""
    flag: bool | None = None
    for key in TRAIN_FLAG_KEYS:
        value = d.get(key)
        if value is None:
            continue
        if key in ("loss", "train"):
            if not isinstance(value, bool):
                ctx.warn("invalid_train_flag", f"{where}.{key} is {value!r}, not true or false")
                continue
            this = value
        elif isinstance(value, bool) or not isinstance(value, int | float):
            ctx.warn("invalid_train_flag", f"{where}.{key} is {value!r}, not a number")
            continue
        elif key == "weight" and value not in (0, 1):
            ctx.warn("invalid_train_flag", f"{where}.weight is {value!r}; OpenAI's weight is 0 or 1")
            continue
        elif value < 0:
            ctx.warn("invalid_train_flag", f"{where}.{key} is negative ({value!r})")
            continue
        else:
            this = value != 0
            if key == "loss_weight" and value not in (0, 1):
                ctx.warn("partial_loss_weight", f"{where}.loss_weight {value!r} trains the turn fully")
        if flag is not None and flag != this:
            ctx.warn("invalid_train_flag", f"{where} has training flags that disagree ({key} says {this})")
        flag = this
    return flag
