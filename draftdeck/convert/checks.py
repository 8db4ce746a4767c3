"""The per-conversation checks of `convert` (see :mod:`draftdeck.convert`): pure functions of one
conversation, run by the one-process reader and by the convert workers alike."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import orjson
from xxhash import xxh3_64_intdigest

from draftdeck.formats.model import PROVENANCE_KEY, Conversation, ImageRef, Message, repeat_of
from draftdeck.formats.writers import SHAREGPT_FROM

# The output turn's keys and role names per JSONL target (as draftdeck.formats.writers writes them):
# a plain conversation's duplicate key is made of its turns in this form (plain_duplicate_key).
TURN_STYLE: dict[str, tuple[str, str, dict[str, str]]] = {
    "sharegpt": ("from", "value", SHAREGPT_FROM),
    "openai": ("role", "content", {r: r for r in ("system", "user", "assistant")}),
}
_PLAIN_ROLES = frozenset({"system", "user", "assistant"})

# A field of the row that no reader took and that holds at least this much text is said, never dropped
# quietly: a chain of thought or a second answer beside the pair that was read.
UNUSED_TEXT_CHARS = 200


def unused_fields(conv: Conversation) -> list[str]:
    """The row's fields the reader left in its meta that hold long text the conversation does not
    already say: neither found in a message (ultrachat's `prompt` repeats the first user turn) nor a
    rendering of the whole conversation (Alpaca's `text`: every message in it)."""
    long = [k for k, v in conv.meta.items() if isinstance(v, str) and len(v) >= UNUSED_TEXT_CHARS]
    if not long:
        return []
    said = [t for m in conv.messages for t in (m.content.strip(), (m.reasoning or "").strip()) if t]
    lines = [line.strip() for s in said for line in s.splitlines() if line.strip()]

    def repeats(text: str) -> bool:
        text = text.strip()  # line by line: a rendering joins the turns with its own headers between
        return any(text in s for s in said) or all(line in text for line in lines)

    return [k for k in long if not repeats(conv.meta[k])]


def unused_text(conv: Conversation) -> list[tuple[str, str]]:
    """``unused_text_field`` for the row's :func:`unused_fields`, with their sizes."""
    unread = unused_fields(conv)
    if not unread:
        return []
    sizes = ", ".join(f"{k!r} ({len(conv.meta[k]):,} characters)" for k in unread)
    return [("unused_text_field", f"no reader used {sizes}; declare it with --columns to train on it")]


def check_conversation(conv: Conversation, allow_prompt_only: bool) -> list[tuple[str, str]]:
    """The issues of one conversation, as (code, reason), rejection-worthy codes first."""
    messages = conv.messages
    if not messages:
        return [("empty_conversation", "the conversation has no messages")]
    issues: list[tuple[str, str]] = unused_text(conv) if conv.meta else []
    has_user = has_assistant = False
    empty_at: list[int] = []
    flagged: list[int] = []  # messages with a per-turn training flag
    for i, m in enumerate(messages):
        if m.train is not None:
            flagged.append(i)
        if m.role == "user":
            has_user = True
        elif m.role == "assistant":
            has_assistant = True
        content = m.content
        if (
            (not content or content.isspace())
            and not m.tool_calls
            and (not m.reasoning or m.reasoning.isspace())
        ):
            empty_at.append(i)
    if len(empty_at) == len(messages):
        return [("empty_conversation", f"all {len(messages)} messages are empty")]
    if flagged:
        issues.extend(_flag_issues(messages, flagged))
    if not has_user:
        issues.append(("no_user_turn", f"roles: {', '.join(m.role for m in messages[:8])}"))
    if not has_assistant and not allow_prompt_only:
        issues.append(("no_assistant_turn", "no assistant message (prompt-only row; allow it to regenerate)"))
    empty_answers = [i for i in empty_at if messages[i].role == "assistant"]
    if empty_answers:
        more = f"; {len(empty_answers) - 1} more" if len(empty_answers) > 1 else ""
        reason = f"assistant message {empty_answers[0]} has no text, reasoning or tool calls{more}"
        issues.insert(0, ("empty_assistant_turn", reason + " (it would train only end-of-turn tokens)"))
        empty_at = [i for i in empty_at if messages[i].role != "assistant"]
    if empty_at:
        issues.append(
            (
                "empty_turn",
                f"message {empty_at[0]} ({messages[empty_at[0]].role}) is empty"
                + (f" and {len(empty_at) - 1} more" if len(empty_at) > 1 else ""),
            )
        )
    if not has_assistant:
        return issues  # prompt-only: consecutive user turns and a final user turn are expected
    last = messages[-1]
    if last.role == "user":
        issues.append(("trailing_user_turn", f"the last of {len(messages)} messages is a user message"))
    prev: str | None = None
    prev_at = 0
    prev_calls = False
    pending_ids: set[str] = set()
    pending_anon = 0
    orphan: str | None = None
    non_alt: str | None = None
    for i, m in enumerate(messages):
        role = m.role
        if role == "system":
            continue
        if role == "tool":
            cid = m.tool_call_id
            if cid is not None and cid in pending_ids:
                pending_ids.discard(cid)
            elif pending_anon > 0 and (cid is None or not pending_ids):
                pending_anon -= 1
            elif cid is None and pending_ids:
                pending_ids.pop()
            elif orphan is None:
                orphan = f"message {i} (tool) answers no earlier tool call" + (
                    f" (tool_call_id {cid!r})" if cid else ""
                )
        elif role == prev and non_alt is None and not (role == "assistant" and prev_calls):
            non_alt = f"messages {prev_at} and {i} are both {role}"
        if role == "assistant" and m.tool_calls:
            pending_ids = {c.id for c in m.tool_calls if c.id}
            pending_anon = sum(1 for c in m.tool_calls if not c.id)
        elif role == "assistant" and "<tool_call>" in m.content:  # Hermes-style calls kept as text
            pending_ids, pending_anon = set(), m.content.count("<tool_call>")
        elif role == "user":
            pending_ids, pending_anon = set(), 0
        if role != "tool":
            prev, prev_at = role, i
            prev_calls = bool(m.tool_calls) or (role == "assistant" and pending_anon > 0)
    if non_alt:
        issues.append(("non_alternating", non_alt))
    if orphan:
        issues.append(("orphan_tool_result", orphan))
    return issues


def _flag_issues(messages: list[Message], flagged: list[int]) -> list[tuple[str, str]]:
    """The issues of per-turn training flags: a flag asking to train what is not an answer (the
    drafter learns the target's answers, nothing else), and the answers a flag leaves untrained."""
    wrong = [i for i in flagged if messages[i].train and messages[i].role != "assistant"]
    if wrong:
        i = wrong[0]
        return [("trained_non_assistant", f"message {i} ({messages[i].role}) has a flag asking to train it")]
    off = [i for i in flagged if messages[i].role == "assistant" and messages[i].train is False]
    if not off:
        return []
    answers = sum(1 for m in messages if m.role == "assistant")
    return [
        ("untrained_answer", f"{len(off)} of {answers} answers untrained by their flag (message {off[0]})")
    ]


def _stripped(text: str) -> str:
    return text.strip() if text and (text[0].isspace() or text[-1].isspace()) else text  # no copy if clean


def plain_duplicate_key(turns: Iterable[tuple[str, str]], to: str, repeat: int = 0) -> int:
    """:func:`duplicate_key` of a plain conversation, from its (role, text) turns: the xxh3 of the turns
    as the JSONL target `to` writes them (texts stripped), so that the fast path hashes the bytes it
    already encoded for the output line instead of encoding the text a second time."""
    role_key, text_key, names = TURN_STYLE[to]
    parts: list[object] = [{role_key: names[r], text_key: _stripped(t)} for r, t in turns]
    if repeat:
        parts.append(("repeat", repeat))
    return xxh3_64_intdigest(orjson.dumps(parts))


def image_identity(ref: ImageRef) -> str:
    """What tells two images apart in a duplicate key: the stored file's hash, else the address."""
    if ref.sha256 or ref.path or ref.url:
        return ref.sha256 or ref.path or ref.url or ""
    return hashlib.sha256(ref.data or b"").hexdigest()


def duplicate_key(conv: Conversation, to: str = "openai") -> int:
    """A 64-bit hash of the normalised messages, the same in every process (xxh3 of their JSON text):
    worker processes compute it for the parent's duplicate set.

    A plain conversation (system, user and assistant text only) hashes as :func:`plain_duplicate_key`
    in the style of the target `to`, any other one as the list of its parts; the two encodings never
    meet, and one read uses one target, so the same messages always give the same key within it."""
    messages = conv.messages
    repeat = repeat_of(conv.meta.get(PROVENANCE_KEY))
    if all(
        m.role in _PLAIN_ROLES
        and m.reasoning is None
        and not m.tool_calls
        and m.train is None
        and not m.images
        for m in messages
    ):
        return plain_duplicate_key([(m.role, m.content) for m in messages], to, repeat)
    parts: list[object] = []
    append = parts.append
    for m in conv.messages:
        c = m.content
        append(m.role)
        append(c.strip() if c and (c[0].isspace() or c[-1].isspace()) else c)  # strip without copying
        append(m.reasoning)
        if m.tool_calls:
            parts.append([(c.name, c.raw_arguments or repr(c.arguments)) for c in m.tool_calls])
        if m.train is not None:  # the same answer trained once and untrained once is not a duplicate
            parts.append(m.train)
        if m.images:  # the same words about another picture are not a duplicate
            parts.append([image_identity(ref) for ref in m.images])
    if repeat:  # a repeat a mix's upsampling declared is deliberate, not a duplicate
        parts.append(("repeat", repeat))
    return xxh3_64_intdigest(orjson.dumps(parts))


def where_prefix(line: int | None, index: int | None, path: str | None) -> str:
    """A reason's prefix locating the record when the line number does not (JSON arrays, tables, trees)."""
    pre = f"record {index}" if line is None and index is not None else ""
    if path:
        pre += f"{' ' if pre else ''}branch {path}"
    return f"{pre}: " if pre else ""
