"""Tool-search answer files (ToolBench's DFS / CoT answers): one JSON object per episode search,
``{"answer_generation": {"query", "function": [function definitions], "train_messages": [message
lists], "final_answer", "valid_data"}, "win"?, "tree"?, ...}``.

``train_messages`` holds the episode at several points of the search, each list a longer prefix of
the same episode (role ``function`` for a tool's result, the assistant's legacy ``function_call``).
Training on every list would train the first answers once per list: the lists that are a prefix of
another one (or repeat it) are left out and counted as ``contained_prefix``; each list no other one
contains (the longest, or the distinct branches of the search) is a conversation, with
``answer_generation.function`` as its tools. The search record beside it (``tree``,
``compare_candidates``, ``forward_args``) is the same episodes seen as a tree: not kept; the query and
the verdicts (``valid_data``, ``win``) are kept as the row's metadata.
"""

from __future__ import annotations

from typing import Any

import orjson

from draftdeck.formats import openai
from draftdeck.formats.common import ParseContext, RowRejected, parse_tools
from draftdeck.formats.model import Conversation, SourceRef

FAMILY = "tool_search"
KEY = "answer_generation"


def looks_like(value: dict[str, Any]) -> bool:
    answer = value.get(KEY)
    return isinstance(answer, dict) and isinstance(answer.get("train_messages"), list)


def _contained(episodes: list[list[bytes]]) -> list[bool]:
    """For each episode (its messages as JSON), whether another one holds it as a prefix (an exact
    repeat counts as held by the first copy)."""
    out = []
    for i, ep in enumerate(episodes):
        held = False
        for j, other in enumerate(episodes):
            if j == i or len(other) < len(ep) or other[: len(ep)] != ep:
                continue
            if len(other) > len(ep) or j < i:
                held = True
                break
        out.append(held)
    return out


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    answer = value[KEY]
    lists = answer["train_messages"]
    if not lists:
        verdict = answer.get("valid_data")
        why = " (valid_data is false: the search found no answer)" if verdict is False else ""
        raise RowRejected("empty_conversation", f"{KEY}.train_messages is empty{why}")
    if not all(isinstance(ep, list) for ep in lists):
        raise RowRejected("unknown_format", f"{KEY}.train_messages is not a list of message lists")
    encoded = [[orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for m in ep] for ep in lists]
    contained = _contained(encoded)
    left = sum(contained)
    if left:
        ctx.warn(
            "contained_prefix",
            f"{left} of the {len(lists)} episodes of {KEY}.train_messages are prefixes of a longer one:"
            " trained once, in the longer",
        )
    functions = answer.get("function")
    tools = [
        t if "function" in t else {"type": "function", "function": t}
        for t in parse_tools(functions, f"{KEY}.function", ctx)
    ]
    meta = {k: answer[k] for k in ("query", "valid_data") if k in answer}
    if "win" in value:
        meta["win"] = value["win"]
    kept = [i for i, held in enumerate(contained) if not held]
    out = []
    for i in kept:
        messages = openai.parse_messages(lists[i], f"{KEY}.train_messages[{i}]", ctx)
        conv = Conversation(messages, tools=list(tools), source_format=FAMILY, meta=dict(meta))
        if len(kept) > 1:
            conv.source = SourceRef(file="", path=f"episode={i}")
        out.append(conv)
    return out
