"""Message trees (OpenAssistant exports): ``{"prompt": node}`` or a bare root node, where a node is
``{"text", "role": prompter|assistant, "replies": [node, ...], "rank"?}``.

``tree_paths="all"`` (default) yields one conversation per leaf (root-to-leaf path);
``tree_paths="best"`` follows, at every node, the reply with the lowest ``rank`` (unranked replies
after ranked ones, ties by position) and yields that single path. Each conversation's
``source.path`` names its branch, e.g. ``"0.1"`` = first reply of the root, then its second reply.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats.common import ParseContext, RowRejected, finish_assistant, text_of
from draftdeck.formats.model import Conversation, Message, SourceRef
from draftdeck.formats.openai import meta_of

FAMILY = "tree"
ROLE_MAP = {
    "prompter": "user",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "system": "system",
}
MAX_LEAVES = 100_000


def root_of(value: dict[str, Any]) -> dict[str, Any] | None:
    prompt = value.get("prompt")
    if isinstance(prompt, dict) and "replies" in prompt:
        return prompt
    if "replies" in value and ("text" in value or "content" in value):
        return value
    return None


def _message(node: dict[str, Any], where: str, ctx: ParseContext) -> Message:
    raw = node.get("role")
    role = ROLE_MAP.get(raw) if isinstance(raw, str) else None
    if role is None:
        raise RowRejected("unknown_role", f"{where} has role {raw!r}")
    text = text_of(node.get("text", node.get("content")), f"{where}.text", ctx)
    return finish_assistant(Message(role, text))  # type: ignore[arg-type]


def _replies(node: dict[str, Any], where: str) -> list[dict[str, Any]]:
    replies = node.get("replies") or []
    if not isinstance(replies, list) or not all(isinstance(r, dict) for r in replies):
        raise RowRejected("unknown_format", f"{where}.replies is not a list of message objects")
    return replies


def _rank_key(item: tuple[int, dict[str, Any]]) -> tuple[int, float, int]:
    i, node = item
    rank = node.get("rank")
    return (
        (0, float(rank), i) if isinstance(rank, int | float) and not isinstance(rank, bool) else (1, 0.0, i)
    )


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    root = root_of(value)
    assert root is not None
    meta = meta_of(value, ("prompt",)) if root is not value else meta_of(value, ("text", "role", "replies"))
    paths: list[tuple[str, list[Message]]] = []
    if ctx.options.tree_paths == "best":
        messages = [_message(root, "prompt", ctx)]
        node, where, path = root, "prompt", []
        while replies := _replies(node, where):
            i, node = min(enumerate(replies), key=_rank_key)
            where += f".replies[{i}]"
            path.append(str(i))
            messages.append(_message(node, where, ctx))
        paths.append((".".join(path), messages))
    else:
        stack: list[tuple[dict[str, Any], str, list[str], list[Message]]] = [
            (root, "prompt", [], [_message(root, "prompt", ctx)])
        ]
        while stack:
            node, where, path, messages = stack.pop()
            replies = _replies(node, where)
            if not replies:
                paths.append((".".join(path), messages))
                if len(paths) > MAX_LEAVES:
                    raise RowRejected("oversize_row", f"the tree has more than {MAX_LEAVES:,} leaves")
                continue
            for i in range(len(replies) - 1, -1, -1):
                w = f"{where}.replies[{i}]"
                stack.append((replies[i], w, [*path, str(i)], [*messages, _message(replies[i], w, ctx)]))
    return [
        Conversation(msgs, source=SourceRef(file="", path=p or None), source_format=FAMILY, meta=dict(meta))
        for p, msgs in paths
    ]
