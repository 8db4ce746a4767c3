"""Regeneration pieces that need no server: reading answers, the checks, the journal, the walk."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from draftdeck.errors import UsageError
from draftdeck.formats.model import Conversation, Message, ToolCall
from draftdeck.issue_codes import CODES
from draftdeck.quality import Policy
from draftdeck.regenerate.answer import Answer, RowRejected, answer_issues, parse_completion
from draftdeck.regenerate.journal import Journal
from draftdeck.regenerate.params import RegenerateParams
from draftdeck.regenerate.walk import walk


def _body(**message: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", **message}, "finish_reason": "stop"}]}


@pytest.mark.parametrize(
    ("message", "content", "reasoning"),
    [
        ({"content": "4", "reasoning_content": "2+2"}, "4", "2+2"),
        ({"content": "4", "reasoning": "2+2"}, "4", "2+2"),  # vLLM's newer field name
        ({"content": "<think>\n2+2\n</think>\n\n4"}, "4", "2+2"),
        ({"content": "2+2\n</think>\n\n4"}, "4", "2+2"),  # the template opened the block in the prompt
        ({"content": "<think>\nstill thinking"}, "", "still thinking"),  # cut off while thinking
        ({"content": None, "tool_calls": []}, "", None),
        ({"content": "a <think> in prose is content"}, "a <think> in prose is content", None),
    ],
)
def test_reasoning_is_read_from_every_field(
    message: dict[str, Any], content: str, reasoning: str | None
) -> None:
    got = parse_completion(_body(**message), "http://x/v1")
    assert (got.content, got.reasoning) == (content, reasoning)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"choices": []},
        {"choices": [{"message": "text"}]},
        _body(content=3),
        _body(content="x", tool_calls="no"),
    ],
)
def test_malformed_answers_are_rejected(body: Any) -> None:
    with pytest.raises(RowRejected) as err:
        parse_completion(body, "http://x/v1")
    assert err.value.code == "malformed_answer"


def test_checks_name_each_problem() -> None:
    def codes(answer: Answer, reasoning_on: bool = True) -> list[str]:
        return [c for c, _ in answer_issues(answer, reasoning_on, 1)]

    assert codes(Answer("fine", None, finish_reason="stop")) == []
    assert codes(Answer("half", None, finish_reason="length")) == ["answer_cut_off"]
    assert codes(Answer("", "thinking...", finish_reason="length")) == ["answer_cut_off", "empty_answer"]
    assert codes(Answer("", None, [ToolCall("f", {"a": 1})])) == []
    assert codes(Answer("x", None, [ToolCall("f", None, "{bad")])) == ["invalid_tool_call"]
    assert codes(Answer("x", "r"), reasoning_on=False) == ["reasoning_in_content"]
    for name in ("answer_cut_off", "empty_answer", "reasoning_in_content", "invalid_tool_call"):
        assert name in CODES


def test_params_need_one_backend_and_never_hold_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="either endpoints"):
        RegenerateParams(inputs=["a"], out="b")
    with pytest.raises(ValueError, match="model name"):
        RegenerateParams(inputs=["a"], out="b", endpoints=["http://x"])
    with pytest.raises(ValueError, match="extra"):
        RegenerateParams(inputs=["a"], out="b", local="m", colour="red")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="extra"):  # a key is never a parameter: it would be stored
        RegenerateParams(inputs=["a"], out="b", endpoints=["http://x"], model="m", api_key="sk")  # type: ignore[call-arg]
    monkeypatch.setenv("TEST_REGEN_KEY", "sk-secret")
    p = RegenerateParams(
        inputs=["a"], out="b", endpoints=["http://x"], model="m", api_key_env="TEST_REGEN_KEY"
    )
    assert p.api_key() == "sk-secret"
    assert "sk-secret" not in repr(p) and "sk-secret" not in str(p.model_dump()) + str(p.sampling())


def test_journal_resumes_and_cuts_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl.journal"
    j = Journal(path, {"inputs": [["a", 1, 2]]})
    j.append({"k": 1, "row": {"messages": []}})
    j.append({"k": 0, "code": "empty_answer", "reason": "r", "file": "a", "line": 1})
    j.close()
    with open(path, "ab") as f:
        f.write(b'{"k": 2, "row": {"mess')  # killed mid-write
    j = Journal(path, {"inputs": [["a", 1, 2]]})
    assert j.resumed == 2 and not j.done(2)
    j.append({"k": 2, "row": {"messages": [1]}})
    assert [r["k"] for r in j.records()] == [0, 1, 2]
    j.close()
    with pytest.raises(UsageError, match="other inputs"):
        Journal(path, {"inputs": [["a", 9, 9]]})


def _conv(*turns: tuple[str, str]) -> Conversation:
    return Conversation([Message(role, text) for role, text in turns])  # type: ignore[arg-type]


def _run_walk(
    conv: Conversation, policy: Policy | None = None
) -> tuple[Conversation, list[list[dict[str, Any]]]]:
    seen: list[list[dict[str, Any]]] = []

    async def ask(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Answer:
        seen.append(messages)
        return Answer(f"answer {len(seen)}", None, finish_reason="stop", endpoint="t")

    got = asyncio.run(walk(conv, ask, policy or Policy(), True))
    return got.conversation, seen


def test_walk_feeds_the_targets_answers_back() -> None:
    conv = _conv(("system", "s"), ("user", "q1"), ("assistant", "OK."), ("user", "q2"), ("assistant", "OK."))
    out, seen = _run_walk(conv)
    assert [m.content for m in out.messages] == ["s", "q1", "answer 1", "q2", "answer 2"]
    assert seen[1] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "q2"},
    ]


def test_walk_answers_every_user_turn_of_a_prompt_only_row() -> None:
    out, seen = _run_walk(_conv(("user", "a"), ("user", "b")))
    assert [(m.role, m.content) for m in out.messages] == [
        ("user", "a"),
        ("assistant", "answer 1"),
        ("user", "b"),
        ("assistant", "answer 2"),
    ]
    assert len(seen) == 2


def test_walk_stops_where_the_targets_tool_calls_differ() -> None:
    conv = Conversation(
        [
            Message("user", "weather?"),
            Message("assistant", "", tool_calls=[ToolCall("get", {"c": "P"}, id="c1")]),
            Message("tool", "sunny", tool_call_id="c1"),
            Message("assistant", "It is sunny."),
        ]
    )

    async def ask(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Answer:
        return Answer("no tools from me", None, finish_reason="stop", endpoint="t")

    got = asyncio.run(walk(conv, ask, Policy(), True))
    assert [m.role for m in got.conversation.messages] == ["user", "assistant"]
    assert [c for c, _ in got.warnings] == ["tool_calls_diverged"]
