"""Preference rows (sets made for DPO and reward models), read as their chosen conversation.

Shapes:

- OpenAI's DPO fine-tuning: ``{"input": {"messages", "tools"?}, "preferred_output": [messages],
  "non_preferred_output": [messages]}``.
- LLaMA-Factory v1: ``{"chosen_messages": [...], "rejected_messages": [...]}``, each a whole
  conversation; its ranking sets: ``conversations`` (or ``messages``, or alpaca's ``instruction`` and
  ``input``) for the prompt and ``chosen`` / ``rejected`` turns.
- TRL and UltraFeedback: ``prompt`` (text or messages) and ``chosen`` / ``rejected`` (text or
  messages); a ``chosen`` list that holds a user turn is the whole conversation (TRL's implicit
  prompt; UltraFeedback also repeats it as ``messages``).
- RLHF prompt pairs (DeepSpeed-Chat and its descendants, Anthropic's HH-RLHF): the turns written in
  the text with ``Human:`` / ``Assistant:`` markers (the text opens with one), ``{"prompt": "Human: ...
  Assistant:", "chosen", "rejected"?, "response"?}`` (``response`` repeats the chosen answer), or a
  ``chosen`` text holding the whole dialogue; the prompt's last, empty ``Assistant:`` is where the
  chosen answer goes. A ``prompt`` with a ``chosen`` and no ``rejected`` is read the same.

With ``preference="chosen"`` (the default) the conversation is the prompt's turns and then the chosen
answer, warned as ``preference_chosen`` so the report says how many rows were preference data; with
``"reject"`` such rows are refused as ``preference_row``. The rejected side never reaches the output:
neither as turns nor as a kept field.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats import openai, sharegpt
from draftdeck.formats.alpaca import history_messages
from draftdeck.formats.common import ParseContext, RowRejected, finish_assistant, parse_tools, text_of
from draftdeck.formats.dialogue import dialogue_turns
from draftdeck.formats.model import Conversation, Message

FAMILY = "preference"
PAIRS = (
    ("preferred_output", "non_preferred_output"),
    ("chosen_messages", "rejected_messages"),
    ("chosen", "rejected"),
)
# Fields of the row that hold the prompt or a side: none of them is kept as metadata.
ROW_KEYS = (
    *(k for pair in PAIRS for k in pair),
    "input",
    "prompt",
    "messages",
    "conversations",
    "instruction",
    "system",
    "tools",
    "history",
    "response",
)


def pair_of(value: dict[str, Any]) -> tuple[str, str] | None:
    for chosen, rejected in PAIRS:
        if chosen in value and rejected in value:
            return chosen, rejected
    if "chosen" in value and "prompt" in value:  # a pair set that kept only the chosen side
        return "chosen", "rejected"
    return None


def _turns(items: Any, where: str, ctx: ParseContext) -> list[Message]:
    """Messages of either style: OpenAI role/content or ShareGPT from/value."""
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list):
        raise RowRejected("unknown_format", f"{where} is a JSON {type(items).__name__}, not messages")
    if items and isinstance(items[0], dict) and "from" in items[0]:
        out: list[Message] = []
        for i, turn in enumerate(items):
            sharegpt.parse_turn(turn, f"{where}[{i}]", ctx, out)
        return out
    return openai.parse_messages(items, where, ctx)


def _side(value: Any, where: str, ctx: ParseContext) -> list[Message]:
    if isinstance(value, str):
        return dialogue_turns(value) or [finish_assistant(Message("assistant", value))]
    return _turns(value, where, ctx)


def _prompt(value: dict[str, Any], ctx: ParseContext) -> tuple[list[Message], list[dict[str, Any]]]:
    """The prompt's messages and tools."""
    inp = value.get("input")
    if isinstance(inp, dict) and "messages" in inp:  # OpenAI DPO
        return openai.parse_messages(inp["messages"], "input.messages", ctx), parse_tools(
            inp.get("tools"), "input.tools", ctx
        )
    tools = parse_tools(value.get("tools"), "tools", ctx)
    prompt = value.get("prompt")
    if prompt is not None:
        if isinstance(prompt, str):
            return (dialogue_turns(prompt) or [Message("user", prompt)]), tools
        return _turns(prompt, "prompt", ctx), tools
    for key in ("conversations", "messages"):
        if value.get(key) is not None:
            return _turns(value[key], key, ctx), tools
    if "instruction" in value:  # LLaMA-Factory's alpaca ranking rows
        instruction = text_of(value.get("instruction"), "instruction", ctx)
        extra = text_of(inp, "input", ctx)
        user = f"{instruction}\n{extra}" if instruction and extra else (instruction or extra)
        return [*history_messages(value.get("history"), ctx), Message("user", user)], tools
    return [], tools


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    pair = pair_of(value)
    assert pair is not None
    chosen_key, rejected_key = pair
    if ctx.options.preference == "reject":
        raise RowRejected("preference_row", f"a preference row ({chosen_key} / {rejected_key})")
    chosen = _side(value[chosen_key], chosen_key, ctx)
    prompt_text = value.get("prompt")
    if isinstance(prompt_text, str) and prompt_text.rstrip().endswith("Assistant:") and len(chosen) == 1:
        chosen[0].content = chosen[0].content.lstrip()  # " answer" after the prompt's "Assistant:"
    if any(m.role == "user" for m in chosen):
        messages, tools = chosen, parse_tools(value.get("tools"), "tools", ctx)  # the whole conversation
    else:
        prompt, tools = _prompt(value, ctx)
        messages = [*prompt, *chosen]
    if "system" in value:
        system = openai.system_text(value["system"], "system", ctx)
        messages = openai.with_system(system, messages, ctx)
    if rejected_key in value:
        ctx.warn("preference_chosen", f"a preference row: {chosen_key} kept, {rejected_key} left out")
    else:
        ctx.warn("preference_chosen", f"a preference row: {chosen_key} kept (it has no {rejected_key} side)")
    meta = openai.meta_of(value, ROW_KEYS)
    return [Conversation(messages, tools=tools, source_format=FAMILY, meta=meta)]
