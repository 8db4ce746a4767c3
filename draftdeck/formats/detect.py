"""Per-row format detection: which shape a JSON object has, and its parser.

Detection looks at one row at a time (a file may mix shapes; the mix is counted in
``report.formats``). The shapes are tried in the order of :data:`SHAPES`, which matters where keys
overlap:

0. chosen and rejected sides -> preference (first: UltraFeedback also holds ``messages``)
1. ``messages`` / ``conversations`` lists, by the keys of their first turn: ``role``/``content`` ->
   openai (SpecForge stores OpenAI messages under ``conversations``), ``from``/``value`` -> sharegpt
   (LLaMA-Factory's sharegpt column may be called ``messages``), ``{human, assistant}`` pair objects
   (ms-swift's ``conversation``) -> turn_pairs. Ultrachat rows hold ``prompt`` beside ``messages``.
   OpenAI-style messages with Anthropic blocks (``tool_use``, ``tool_result``, ``thinking``) or a
   system of blocks -> anthropic. OpenAI and ShareGPT rows whose text holds Hermes ``<tool_call>`` /
   ``<tool_response>`` tags -> hermes once the tags are lifted (``tool_tags="keep"``: left as text).
   A row that is a bare list of messages is that list under ``messages`` (or ``conversations``).
1b. ``contents`` of role/parts -> gemini; a ``chat`` text with ``USER:`` / ``ASSISTANT:`` -> glaive
1c. agent traces: a session log's lines (grouped into ``agent_session`` rows by
   :mod:`draftdeck.formats.grouping`) -> agent_session; ``events``, a list of agent events (or a file
   of them) -> event_stream; ToolBench's ``answer_generation.train_messages`` -> tool_search
2. ``history``/``trajectory`` of message objects -> trajectory
3. ``prompt`` node with ``replies`` (or a node) -> tree
4. ``instruction`` + ``output`` -> alpaca; ``instruction`` + ``response`` (+ ``context``, Dolly) ->
   instruction_response
5. query/response, question/answer, prompt/response, prompt/completion, input/output (torchtune's
   instruct default) -> query_response
6. ``prompt`` / ``question`` / ``instruction`` / ``turns`` alone -> prompt (prompt-only)

Anything else raises RowRejected("unknown_format") naming the keys the row had. A row's images (LLaVA's
``image``, ms-swift's and LLaMA-Factory's ``images`` list beside ``<image>`` placeholders in the text,
image content parts) are read into its messages and checked, whatever its shape
(:mod:`draftdeck.formats.image_parts`); a row with audio or video (``audios``/``videos`` lists, such
parts), or with images when the options refuse them, is refused as ``multimodal_content``.

``ParseOptions.from_format`` forces one shape: the row is read by that shape's parser when it has
that shape's keys, and rejected as ``format_mismatch`` (naming what the shape needs and what the row
has) when it has not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from draftdeck.formats import (
    agent_session,
    alpaca,
    anthropic,
    columns,
    event_stream,
    gemini,
    glaive,
    hermes,
    image_parts,
    openai,
    pairs,
    preference,
    prompt,
    sharegpt,
    tool_search,
    trajectory,
    tree,
)
from draftdeck.formats.common import ParseContext, RowRejected, keys_of
from draftdeck.formats.model import Conversation

Parser = Callable[[dict[str, Any], ParseContext], list[Conversation]]

# The names `--from` takes, as a type the parameter models (and so the form, API and CLI) share.
FormatName = Literal[
    "openai",
    "sharegpt",
    "anthropic",
    "gemini",
    "glaive",
    "hermes",
    "preference",
    "turn_pairs",
    "agent_session",
    "event_stream",
    "tool_search",
    "trajectory",
    "tree",
    "alpaca",
    "instruction_response",
    "query_response",
    "prompt",
]
FORMAT_NAMES: tuple[str, ...] = get_args(FormatName)

LIST_KEYS = ("messages", "conversations", "conversation")
MEDIA_KEYS = ("images", "image", "audios", "audio", "videos", "video")
_MEDIA_KEY_SET = frozenset(MEDIA_KEYS)
MEDIA_PLACEHOLDERS = ("<image>", "<audio>", "<video>")


def turn_style(value: dict[str, Any]) -> tuple[str, str] | None:
    """(family, key) of the first list of turns in `value`, judged by its first turn's keys."""
    for key in LIST_KEYS:
        turns = value.get(key)
        if not isinstance(turns, list):
            continue
        first = turns[0] if turns else None
        if isinstance(first, dict):
            if "from" in first:
                return sharegpt.FAMILY, key
            if "role" in first:
                return openai.FAMILY, key
            if "human" in first or "assistant" in first:
                return pairs.FAMILY, key
        if key == "messages":
            return openai.FAMILY, key  # an empty list, or turns the OpenAI parser names the fault of
        if key == "conversations":
            return sharegpt.FAMILY, key
    return None


def list_style(value: dict[str, Any]) -> tuple[str, str] | None:
    """(family, key) of a row of turns, with OpenAI-style rows that use Anthropic's blocks told apart."""
    style = turn_style(value)
    if (
        style is not None
        and style[0] == openai.FAMILY
        and style[1] == "messages"
        and anthropic.looks_like(value)
    ):
        return anthropic.FAMILY, "messages"
    return style


def parse_turns(family: str, key: str, value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    """The conversation of a row whose turns under `key` have the style of `family`."""
    if family == anthropic.FAMILY:
        return anthropic.parse_row(value, ctx)
    if family == openai.FAMILY:
        if key == "messages":
            return openai.parse_row(value, ctx)
        convs = sharegpt.parse_row(value, ctx, key)  # reads role/content turns as OpenAI messages
        for conv in convs:
            conv.source_format = openai.FAMILY
        return convs
    if family == sharegpt.FAMILY:
        return sharegpt.parse_row(value, ctx, key)
    return pairs.parse_row(value, ctx, key)


def _list_parser(family: str) -> Parser:
    def parse_list(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
        style = list_style(value)
        assert style is not None and style[0] == family
        return parse_turns(family, style[1], value, ctx)

    return parse_list


def _is_style(family: str) -> Callable[[dict[str, Any]], bool]:
    def matches(value: dict[str, Any]) -> bool:
        style = list_style(value)
        return style is not None and style[0] == family and preference.pair_of(value) is None

    return matches


def _is_hermes(value: dict[str, Any]) -> bool:
    style = list_style(value)
    return style is not None and style[0] in (openai.FAMILY, sharegpt.FAMILY) and hermes.raw_has_tags(value)


def _parse_hermes(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    style = list_style(value)
    assert style is not None
    convs = parse_turns(style[0], style[1], value, ctx)
    for conv in convs:
        hermes.lift(conv, ctx)
        conv.source_format = hermes.FAMILY
    return convs


@dataclass(frozen=True, slots=True)
class Shape:
    name: str  # the family counted in report.formats and named by --from
    needs: str  # what a row of this shape holds, for format_mismatch reasons
    matches: Callable[[dict[str, Any]], bool]
    parser: Parser


SHAPES: tuple[Shape, ...] = (
    Shape(
        openai.FAMILY,
        "a messages (or conversations) list of role/content turns",
        _is_style(openai.FAMILY),
        _list_parser(openai.FAMILY),
    ),
    Shape(
        sharegpt.FAMILY,
        "a conversations (or messages) list of from/value turns",
        _is_style(sharegpt.FAMILY),
        _list_parser(sharegpt.FAMILY),
    ),
    Shape(
        anthropic.FAMILY,
        "a messages list whose content holds Anthropic blocks (tool_use, tool_result, thinking)"
        " or a system of text blocks",
        _is_style(anthropic.FAMILY),
        _list_parser(anthropic.FAMILY),
    ),
    Shape(
        gemini.FAMILY,
        "a contents list of role/parts turns (systemInstruction optional)",
        gemini.looks_like,
        gemini.parse_row,
    ),
    Shape(
        glaive.FAMILY,
        "a chat text with USER: / ASSISTANT: / FUNCTION RESPONSE: turns (system optional)",
        glaive.looks_like,
        glaive.parse_row,
    ),
    Shape(
        hermes.FAMILY,
        "OpenAI or ShareGPT turns with <tool_call> or <tool_response> text",
        _is_hermes,
        _parse_hermes,
    ),
    Shape(
        preference.FAMILY,
        "chosen and rejected sides (chosen/rejected, chosen_messages/rejected_messages, preferred_output/"
        "non_preferred_output)",
        lambda v: preference.pair_of(v) is not None,
        preference.parse_row,
    ),
    Shape(
        pairs.FAMILY,
        "a conversation list of {human, assistant} objects",
        _is_style(pairs.FAMILY),
        _list_parser(pairs.FAMILY),
    ),
    Shape(
        agent_session.FAMILY,
        "the lines of a coding-agent session log (type, uuid, parentUuid, sessionId, message)",
        lambda v: isinstance(v.get(agent_session.KEY), list),
        agent_session.parse_row,
    ),
    Shape(
        event_stream.FAMILY,
        "a list of agent events (source, action or observation, tool_call_metadata)",
        lambda v: event_stream.events_key(v) is not None,
        event_stream.parse_row,
    ),
    Shape(
        tool_search.FAMILY,
        "answer_generation.train_messages, a list of message lists (ToolBench)",
        tool_search.looks_like,
        tool_search.parse_row,
    ),
    Shape(
        trajectory.FAMILY,
        "a history or trajectory list of messages or steps",
        lambda v: ("history" in v or "trajectory" in v) and trajectory.trajectory_key(v) is not None,
        trajectory.parse_row,
    ),
    Shape(
        tree.FAMILY,
        "a prompt node with replies",
        lambda v: tree.root_of(v) is not None,
        tree.parse_row,
    ),
    Shape(
        alpaca.ALPACA,
        "instruction and output",
        lambda v: "instruction" in v and "output" in v,
        alpaca.parse_alpaca,
    ),
    Shape(
        alpaca.INSTRUCTION_RESPONSE,
        "instruction and response (context optional)",
        lambda v: "instruction" in v and "response" in v,
        alpaca.parse_instruction_response,
    ),
    Shape(
        alpaca.QUERY_RESPONSE,
        "query/response, question/answer, prompt/response, prompt/completion or input/output text",
        lambda v: alpaca.pair_of(v) is not None,
        alpaca.parse_query_response,
    ),
    Shape(
        prompt.FAMILY,
        "prompt, question or instruction text, or a turns list",
        lambda v: prompt.prompt_key(v) is not None,
        prompt.parse_row,
    ),
)
SHAPES_BY_NAME: dict[str, Shape] = {s.name: s for s in SHAPES}
# told apart by list_style; hermes is found after parsing (its tags are inside the text)
LIST_SHAPES = frozenset({openai.FAMILY, anthropic.FAMILY, sharegpt.FAMILY, pairs.FAMILY, hermes.FAMILY})
OTHER_SHAPES = tuple(s for s in SHAPES if s.name not in LIST_SHAPES and s.name != preference.FAMILY)
assert tuple(SHAPES_BY_NAME) == FORMAT_NAMES, "FormatName and SHAPES must list the same shapes"


def check_format_name(name: str | None) -> None:
    """Raise ValueError for a `--from` name no shape has, listing the known ones."""
    if name is not None and name not in SHAPES_BY_NAME:
        raise ValueError(f"unknown input format {name!r}; known formats: {', '.join(FORMAT_NAMES)}")


def detect(value: dict[str, Any]) -> tuple[str, Parser]:
    """Return (family, parser) for one row, or raise RowRejected("unknown_format", ...)."""
    if preference.pair_of(value) is not None:
        return preference.FAMILY, preference.parse_row
    style = list_style(value)
    if style is not None:
        return style[0], SHAPES_BY_NAME[style[0]].parser
    for shape in OTHER_SHAPES:
        if shape.matches(value):
            return shape.name, shape.parser
    raise unknown_format(value)


def unknown_format(value: dict[str, Any]) -> RowRejected:
    """The rejection of a row no shape matches, naming what it holds."""
    for key in LIST_KEYS[:2]:
        found = value.get(key)
        if found is not None:
            return RowRejected(
                "unknown_format", f"{key} is a JSON {type(found).__name__}, not a list of turns"
            )
    return RowRejected("unknown_format", f"no known chat shape has the keys: {keys_of(value)}")


def media_of(value: dict[str, Any]) -> str | None:
    """What images, audio or video the row points at (None for a text-only row)."""
    if value.keys().isdisjoint(_MEDIA_KEY_SET):  # the usual row: one set test, no per-key lookups
        return None
    found = []
    for key in MEDIA_KEYS:
        media = value.get(key)
        if media is None or media == "" or media == []:
            continue
        n = len(media) if isinstance(media, list) else 1
        found.append(f"{key} ({n})")
    if not found:
        return None
    text = repr(value)  # rows with media are rare: count their placeholders the simple way
    marks = [f"{text.count(m)} {m}" for m in MEDIA_PLACEHOLDERS if m in text]
    return ", ".join(found) + (f" and placeholders {', '.join(marks)}" if marks else "")


def list_row(value: list[Any]) -> dict[str, Any]:
    """A row that is a bare list of messages (a JSONL line ``[{"role": ...}, ...]``) as the one
    conversation it is; RowRejected("not_an_object") for any other list."""
    first = value[0] if value else None
    if isinstance(first, dict) and all(isinstance(m, dict) for m in value):
        if "role" in first:
            return {"messages": value}
        if "from" in first:
            return {"conversations": value}
        if event_stream.is_event(first):
            return {event_stream.KEY: value}
    if event_stream.is_event_list(value):  # [action, observation] pairs
        return {event_stream.KEY: value}
    raise RowRejected(
        "not_an_object",
        "a JSON list, not an object (nor a list of role or from messages, nor of agent events)",
    )


def parse(value: Any, ctx: ParseContext) -> tuple[str, list[Conversation]]:
    """Detect (or, with ``from_format``, check) and parse one row: (family, conversations).

    Raises RowRejected."""
    if isinstance(value, list):
        value = list_row(value)
    if not isinstance(value, dict):
        raise RowRejected("not_an_object", f"a JSON {type(value).__name__}, not an object")
    row_images = None
    if not value.keys().isdisjoint(_MEDIA_KEY_SET):
        media = media_of(value)
        if media is not None:
            value, row_images = image_parts.row_media(value, ctx, media)
    family, convs = _parse_object(value, ctx)
    if row_images:
        image_parts.attach_row_images(convs, row_images)
    if ctx.images:
        image_parts.check_row(convs, ctx)
    return family, convs


def _parse_object(value: dict[str, Any], ctx: ParseContext) -> tuple[str, list[Conversation]]:
    if ctx.options.columns:  # declared by the user: it reads the row, detection does not
        return columns.FAMILY, columns.parse_mapped(value, ctx)
    forced = ctx.options.from_format
    if forced is not None:
        shape = SHAPES_BY_NAME[forced]
        if not shape.matches(value):
            try:
                seen = f"it reads as {detect(value)[0]}"
            except RowRejected:
                seen = "it matches no known shape"
            raise RowRejected(
                "format_mismatch",
                f"not {forced} (which needs {shape.needs}): {seen}; keys: {keys_of(value)}",
            )
        return shape.name, shape.parser(value, ctx)
    if preference.pair_of(value) is not None:  # before the turns: UltraFeedback repeats `messages`
        return preference.FAMILY, preference.parse_row(value, ctx)
    style = list_style(value)  # most rows: a list of turns, so look once and parse it directly
    if style is not None:
        family = style[0]
        convs = parse_turns(family, style[1], value, ctx)
        if ctx.options.tool_tags == "parse" and family in (openai.FAMILY, sharegpt.FAMILY):
            for conv in convs:
                if hermes.has_tags(conv.messages) and hermes.lift(conv, ctx):
                    conv.source_format = family = hermes.FAMILY
        return family, convs
    for shape in OTHER_SHAPES:
        if shape.matches(value):
            return shape.name, shape.parser(value, ctx)
    raise unknown_format(value)
