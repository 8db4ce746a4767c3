"""A chat completion read into an `Answer`, and the checks every answer goes through.

Reasoning arrives in three places: ``reasoning_content`` (DeepSeek, SGLang, `transformers serve`),
``reasoning`` (vLLM since vllm#38488) or a ``<think>`` block in the content. All three end up in
`Answer.reasoning`, so the output turn keeps reasoning structured and the content clean.

The answer's token ids, where the server gives them: vLLM's ``choices[0].token_ids`` (asked for with
``return_token_ids``), an ``output_ids`` list (SGLang's name for them), or logprob tokens spelled
``token_id:N`` (vLLM's ``return_tokens_as_token_ids``). Tokenize uses them instead of re-encoding
the text (draftdeck.tokenize.target_ids).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from draftdeck.formats.model import ToolCall

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class RowRejected(Exception):
    """This row cannot be answered (the code and reason go into the report)."""

    def __init__(self, code: str, reason: str):
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


@dataclass
class Answer:
    content: str
    reasoning: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    endpoint: str = ""
    raw_think_in_content: bool = False  # the content held a <think> block (split off into reasoning)
    token_ids: list[int] | None = None  # the ids the model produced for this answer, when known


def split_think(text: str, opened: bool = False) -> tuple[str | None, str]:
    """(reasoning, content) of text that may hold a ``<think>`` block. `opened`: the prompt already
    opened the block (a template's generation prefix), so the text starts inside it."""
    if not opened:
        start = text.find(THINK_OPEN)
        if start < 0 or text[:start].strip():
            return None, text
        text = text[start + len(THINK_OPEN) :]
    end = text.find(THINK_CLOSE)
    if end < 0:  # never closed: the whole answer is reasoning (cut off while thinking)
        return text.strip("\n"), ""
    return text[:end].strip("\n"), text[end + len(THINK_CLOSE) :].lstrip("\n")


def _tool_calls(raw: Any, where: str) -> list[ToolCall]:
    if raw in (None, []):
        return []
    if not isinstance(raw, list):
        raise RowRejected("malformed_answer", f"{where}: tool_calls is {type(raw).__name__}, not a list")
    calls = []
    for i, tc in enumerate(raw):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RowRejected("malformed_answer", f"{where}: tool call {i} has no function name")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                calls.append(ToolCall(fn["name"], json.loads(args), None, tc.get("id")))
            except json.JSONDecodeError:
                calls.append(ToolCall(fn["name"], None, args, tc.get("id")))
        else:
            calls.append(ToolCall(fn["name"], args, None, tc.get("id")))
    return calls


def _ids(raw: Any) -> list[int] | None:
    if isinstance(raw, list) and raw and all(type(t) is int and t >= 0 for t in raw):
        return raw
    return None


def _logprob_ids(logprobs: Any) -> list[int] | None:
    """The ids of logprob tokens spelled ``token_id:N`` (None: not that spelling)."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return None
    out = []
    for entry in content:
        token = entry.get("token") if isinstance(entry, dict) else None
        if not isinstance(token, str) or not token.startswith("token_id:") or not token[9:].isdigit():
            return None
        out.append(int(token[9:]))
    return out


def answer_token_ids(choice: dict[str, Any]) -> list[int] | None:
    """The generated token ids a chat completion's choice carries, in any of the spellings above."""
    found = _ids(choice.get("token_ids")) or _ids(choice.get("output_ids"))
    return found or _logprob_ids(choice.get("logprobs"))


def parse_completion(body: Any, endpoint: str) -> Answer:
    """Read an OpenAI chat completion; raise `RowRejected("malformed_answer")` for anything else."""
    try:
        choice = body["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise RowRejected("malformed_answer", f"{endpoint}: no choices[0].message in the answer") from None
    if not isinstance(msg, dict):
        raise RowRejected("malformed_answer", f"{endpoint}: choices[0].message is not an object")
    content = msg.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise RowRejected("malformed_answer", f"{endpoint}: content is {type(content).__name__}, not text")
    reasoning = msg.get("reasoning_content")
    if reasoning is None:
        reasoning = msg.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise RowRejected("malformed_answer", f"{endpoint}: reasoning is not text")
    think_in_content = False
    if THINK_OPEN in content or THINK_CLOSE in content:
        think_in_content = True
        # a lone </think>: the template opened the block in the prompt
        found, rest = split_think(content, opened=THINK_OPEN not in content)
        if found is not None:
            reasoning = found if not reasoning else reasoning + "\n" + found
            content = rest
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return Answer(
        content=content,
        reasoning=reasoning or None,
        tool_calls=_tool_calls(msg.get("tool_calls"), endpoint),
        finish_reason=choice.get("finish_reason"),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        endpoint=endpoint,
        raw_think_in_content=think_in_content,
        token_ids=answer_token_ids(choice) if isinstance(choice, dict) else None,
    )


def answer_issues(answer: Answer, reasoning_on: bool, turn: int) -> list[tuple[str, str]]:
    """The checks of one answer, as (code, reason); rejecting codes first."""
    at = f"turn {turn} from {answer.endpoint}"
    issues = []
    if answer.finish_reason == "length":
        issues.append(
            ("answer_cut_off", f"{at}: finish_reason 'length' after {answer.completion_tokens} tokens")
        )
    if not answer.content.strip() and not answer.tool_calls:
        what = "only reasoning" if answer.reasoning else "nothing"
        issues.append(("empty_answer", f"{at}: no content and no tool calls ({what})"))
    if not reasoning_on and (answer.raw_think_in_content or answer.reasoning):
        issues.append(("reasoning_in_content", f"{at}: reasoning came back although reasoning is off"))
    bad = [c.name for c in answer.tool_calls if not c.arguments_valid]
    if bad:
        issues.append(("invalid_tool_call", f"{at}: arguments of {', '.join(bad)} are not valid JSON"))
    return issues
