"""Per-row format detection: which family a JSON object belongs to, and its parser.

Detection looks at one row at a time (a file may mix shapes; the mix is counted in
``report.formats``). The order matters where keys overlap:

1. ``messages`` (a list)                          -> openai    (ultrachat rows also hold ``prompt``)
2. ``conversations`` (a list of from/value turns) -> sharegpt; of role/content turns -> openai
   (SpecForge stores OpenAI messages under ``conversations``; both go through the ShareGPT parser)
3. ``history``/``trajectory`` of message objects  -> trajectory
4. ``prompt`` node with ``replies`` (or a node)   -> tree
5. ``instruction`` + ``output``                   -> alpaca
6. query/response, question/answer, prompt/response, prompt/completion -> query_response
7. ``prompt`` / ``question`` / ``instruction`` / ``turns`` alone     -> prompt (prompt-only)

Anything else raises RowRejected("unknown_format") naming the keys the row had.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftdeck.formats import alpaca, openai, prompt, sharegpt, trajectory, tree
from draftdeck.formats.common import ParseContext, RowRejected, keys_of
from draftdeck.formats.model import Conversation

Parser = Callable[[dict[str, Any], ParseContext], list[Conversation]]


def detect(value: dict[str, Any]) -> tuple[str, Parser]:
    """Return (family, parser) for one row, or raise RowRejected("unknown_format", ...)."""
    msgs = value.get("messages")
    if isinstance(msgs, list):
        return openai.FAMILY, openai.parse_row
    conv = value.get("conversations")
    if isinstance(conv, list):
        first = conv[0] if conv else None
        if isinstance(first, dict) and "role" in first and "from" not in first:
            return openai.FAMILY, sharegpt.parse_row  # OpenAI messages stored under `conversations`
        return sharegpt.FAMILY, sharegpt.parse_row
    if ("history" in value or "trajectory" in value) and trajectory.trajectory_key(value):
        return trajectory.FAMILY, trajectory.parse_row
    if tree.root_of(value) is not None:
        return tree.FAMILY, tree.parse_row
    if "instruction" in value and "output" in value:
        return alpaca.ALPACA, alpaca.parse_alpaca
    if alpaca.pair_of(value) is not None:
        return alpaca.QUERY_RESPONSE, alpaca.parse_query_response
    if prompt.prompt_key(value) is not None:
        return prompt.FAMILY, prompt.parse_row
    if msgs is not None or conv is not None:
        key = "messages" if msgs is not None else "conversations"
        found = msgs if msgs is not None else conv
        raise RowRejected("unknown_format", f"{key} is a JSON {type(found).__name__}, not a list of turns")
    raise RowRejected("unknown_format", f"no known chat shape has the keys: {keys_of(value)}")


def parse(value: Any, ctx: ParseContext) -> tuple[str, list[Conversation]]:
    """Detect and parse one row: (family, conversations). Raises RowRejected."""
    if not isinstance(value, dict):
        raise RowRejected("not_an_object", f"a JSON {type(value).__name__}, not an object")
    family, parser = detect(value)
    return family, parser(value, ctx)
