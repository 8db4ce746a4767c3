"""Per-family parsing and per-row detection (draftdeck.formats.*): one JSON row in, conversations out.
(test_parse_shapes.py: trees, trajectories, unknown rows, the shapes people write, --from.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from draftdeck.formats.common import ParseContext, ParseOptions, RowRejected, split_think
from draftdeck.formats.detect import parse
from tests.unit.formats.reading import parse_row


class TestOpenAI:
    def test_string_content(self) -> None:
        family, [conv], warnings = parse_row(
            {
                "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                "id": 3,
            }
        )
        assert family == "openai"
        assert [(m.role, m.content) for m in conv.messages] == [("user", "hi"), ("assistant", "hello")]
        assert conv.meta == {"id": 3}
        assert warnings == {}

    def test_typed_parts_text_value_reasoning_and_tool_call(self) -> None:
        row = {
            "messages": [
                {"role": "user", "content": [{"type": "text", "value": "a"}, {"type": "text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "reasoning", "value": "think"},
                        {"type": "tool_call", "value": '{"name": "f", "arguments": {"x": 1}}'},
                    ],
                },
            ]
        }
        _, [conv], _ = parse_row(row)
        assert conv.messages[0].content == "ab"
        msg = conv.messages[1]
        assert msg.reasoning == "think"
        assert msg.content == ""
        assert [(c.name, c.arguments) for c in msg.tool_calls] == [("f", {"x": 1})]

    def test_tool_calls_ids_and_tool_role(self) -> None:
        row = {
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "read", "arguments": '{"p": "a"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "data"},
                {"role": "assistant", "content": "done"},
            ]
        }
        _, [conv], _ = parse_row(row)
        call = conv.messages[1].tool_calls[0]
        assert (call.id, call.name, call.arguments, call.raw_arguments) == ("c1", "read", {"p": "a"}, None)
        assert conv.messages[2].role == "tool"
        assert conv.messages[2].tool_call_id == "c1"

    def test_invalid_arguments_kept_as_text_and_warned(self) -> None:
        row = {
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": '{"a": '}}],
                },
            ]
        }
        _, [conv], warnings = parse_row(row)
        call = conv.messages[1].tool_calls[0]
        assert call.arguments is None
        assert call.raw_arguments == '{"a": '
        assert "invalid_tool_arguments" in warnings

    @pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
    def test_reasoning_fields(self, key: str) -> None:
        row = {
            "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", key: "why"}]
        }
        _, [conv], _ = parse_row(row)
        assert conv.messages[1].reasoning == "why"

    def test_empty_reasoning_content_is_none(self) -> None:
        row = {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y", "reasoning_content": ""},
            ]
        }
        _, [conv], _ = parse_row(row)
        assert conv.messages[1].reasoning is None

    def test_inline_think_moves_to_reasoning(self) -> None:
        row = {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "<think>\nstep 1\n</think>\n\nanswer"},
            ]
        }
        _, [conv], _ = parse_row(row)
        assert (conv.messages[1].reasoning, conv.messages[1].content) == ("step 1", "answer")

    def test_think_in_user_text_stays(self) -> None:
        row = {
            "messages": [
                {"role": "user", "content": "<think>a</think>b"},
                {"role": "assistant", "content": "c"},
            ]
        }
        _, [conv], _ = parse_row(row)
        assert conv.messages[0].content == "<think>a</think>b"

    def test_unknown_role_rejected(self) -> None:
        with pytest.raises(RowRejected) as exc:
            parse_row({"messages": [{"role": "narrator", "content": "x"}]})
        assert exc.value.code == "unknown_role"
        assert "narrator" in exc.value.reason

    def test_extra_message_field_is_reported(self) -> None:
        _, _, warnings = parse_row({"messages": [{"role": "user", "content": "x", "tokens_used": 3}]})
        assert "tokens_used" in warnings["unrepresentable_field"]

    def test_image_part_is_read_or_refused_by_name(self, tmp_path: Path) -> None:
        # images refused (a text target): the row is multimodal, never half a turn trained without it
        row = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "x.png"}},
                        {"type": "text", "text": "what?"},
                    ],
                }
            ]
        }
        with pytest.raises(RowRejected) as exc:
            parse_row(row, images="reject")
        assert exc.value.code == "multimodal_content"
        assert "messages[0].content[0]" in exc.value.reason and "image_url" in exc.value.reason
        # kept (the default): the image is read, relative to the file's folder; here it is not there
        with pytest.raises(RowRejected) as exc:
            parse(row, ParseContext(ParseOptions(), base_dir=str(tmp_path)))
        assert exc.value.code == "image_missing" and str(tmp_path / "x.png") in exc.value.reason


class TestShareGPT:
    def test_roles_and_top_level_system(self) -> None:
        row = {
            "system": "S",
            "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
        }
        family, [conv], _ = parse_row(row)
        assert family == "sharegpt"
        assert [(m.role, m.content) for m in conv.messages] == [
            ("system", "S"),
            ("user", "q"),
            ("assistant", "a"),
        ]

    def test_function_call_observation_and_tools_string(self) -> None:
        row = {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "function_call", "value": '{"name": "s", "arguments": {"k": [1]}}'},
                {"from": "observation", "value": "{}"},
                {"from": "gpt", "value": "a"},
            ],
            "tools": '[{"name": "s"}]',
        }
        _, [conv], _ = parse_row(row)
        assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
        assert conv.messages[1].tool_calls[0].arguments == {"k": [1]}
        assert conv.tools == [{"name": "s"}]

    def test_tools_empty_string_list(self) -> None:
        _, [conv], warnings = parse_row({"conversations": [{"from": "human", "value": "q"}], "tools": "[]"})
        assert conv.tools == []
        assert warnings == {}

    def test_function_call_after_gpt_attaches_to_it(self) -> None:
        row = {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "gpt", "value": "Let me check."},
                {"from": "function_call", "value": '{"name": "s", "arguments": {}}'},
            ]
        }
        _, [conv], _ = parse_row(row)
        assert len(conv.messages) == 2
        assert conv.messages[1].content == "Let me check."
        assert conv.messages[1].tool_calls[0].name == "s"

    def test_reasoning_content_on_turn_and_tool_call_xml_left_as_text(self) -> None:
        xml = '<tool_call>\n{"name": "dim", "arguments": {}}\n</tool_call>'
        row = {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "gpt", "value": xml, "reasoning_content": "plan"},
            ]
        }
        family, [conv], _ = parse_row(row, tool_tags="keep")
        assert family == "sharegpt"
        assert conv.messages[1].content == xml
        assert conv.messages[1].reasoning == "plan"
        assert conv.messages[1].tool_calls == []
        family, [conv], _ = parse_row(row)  # the default lifts the tags into a structured call
        assert family == "hermes"
        assert (conv.messages[1].content, conv.messages[1].reasoning) == ("", "plan")
        assert [(c.name, c.arguments) for c in conv.messages[1].tool_calls] == [("dim", {})]

    def test_role_content_under_conversations(self) -> None:
        row = {"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
        family, [conv], _ = parse_row(row)
        assert family == "openai"
        assert [m.role for m in conv.messages] == ["user", "assistant"]

    def test_null_extra_turn_keys_are_not_reported(self) -> None:
        row = {"conversations": [{"from": "human", "value": "q", "markdown": None, "text": None}]}
        _, _, warnings = parse_row(row)
        assert warnings == {}

    def test_unknown_from(self) -> None:
        with pytest.raises(RowRejected) as exc:
            parse_row({"conversations": [{"from": "alien", "value": "x"}]})
        assert exc.value.code == "unknown_role"


class TestAlpacaAndQueryResponse:
    def test_alpaca_joins_input_and_keeps_history(self) -> None:
        row = {
            "instruction": "Do",
            "input": "this",
            "output": "done",
            "system": "S",
            "history": [["q0", "a0"]],
        }
        family, [conv], _ = parse_row(row)
        assert family == "alpaca"
        assert [(m.role, m.content) for m in conv.messages] == [
            ("system", "S"),
            ("user", "q0"),
            ("assistant", "a0"),
            ("user", "Do\nthis"),
            ("assistant", "done"),
        ]

    @pytest.mark.parametrize(
        ("q", "a"), [("query", "response"), ("question", "answer"), ("prompt", "completion")]
    )
    def test_query_response_pairs(self, q: str, a: str) -> None:
        family, [conv], _ = parse_row({q: "Q", a: "A"})
        assert family == "query_response"
        assert [(m.role, m.content) for m in conv.messages] == [("user", "Q"), ("assistant", "A")]


class TestPromptOnly:
    @pytest.mark.parametrize(
        "row", [{"prompt": "p"}, {"question": "p"}, {"instruction": "p"}, {"turns": ["p"]}]
    )
    def test_prompt_shapes(self, row: dict[str, Any]) -> None:
        family, [conv], _ = parse_row(row)
        assert family == "prompt"
        assert [(m.role, m.content) for m in conv.messages] == [("user", "p")]
        assert not conv.has_assistant

    def test_mt_bench_turns_become_user_turns(self) -> None:
        _, [conv], _ = parse_row({"question_id": 81, "turns": ["a", "b"]})
        assert [m.role for m in conv.messages] == ["user", "user"]
        assert conv.meta == {"question_id": 81}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>a</think>b", ("a", "b")),
        ("  <think>\na\n</think>\n\nb", ("a", "b")),
        ("<think>unclosed", (None, "<think>unclosed")),
        ("b <think>a</think>", (None, "b <think>a</think>")),
    ],
)
def test_split_think(text: str, expected: tuple[str | None, str]) -> None:
    assert split_think(text) == expected
