"""Per-family parsing and per-row detection (draftdeck.formats.*): one JSON row in, conversations out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draftdeck.formats.common import ParseContext, ParseOptions, RowRejected, split_think
from draftdeck.formats.detect import parse
from tests.conftest import FIXTURES as TEST_FIXTURES


def _parse(row: dict[str, Any], **opts: Any) -> tuple[str, list, dict[str, str]]:
    ctx = ParseContext(ParseOptions(**opts))
    family, convs = parse(row, ctx)
    return family, convs, ctx.warnings


class TestOpenAI:
    def test_string_content(self) -> None:
        family, [conv], warnings = _parse(
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
        _, [conv], _ = _parse(row)
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
        _, [conv], _ = _parse(row)
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
        _, [conv], warnings = _parse(row)
        call = conv.messages[1].tool_calls[0]
        assert call.arguments is None
        assert call.raw_arguments == '{"a": '
        assert "invalid_tool_arguments" in warnings

    @pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
    def test_reasoning_fields(self, key: str) -> None:
        row = {
            "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", key: "why"}]
        }
        _, [conv], _ = _parse(row)
        assert conv.messages[1].reasoning == "why"

    def test_empty_reasoning_content_is_none(self) -> None:
        row = {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y", "reasoning_content": ""},
            ]
        }
        _, [conv], _ = _parse(row)
        assert conv.messages[1].reasoning is None

    def test_inline_think_moves_to_reasoning(self) -> None:
        row = {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "<think>\nstep 1\n</think>\n\nanswer"},
            ]
        }
        _, [conv], _ = _parse(row)
        assert (conv.messages[1].reasoning, conv.messages[1].content) == ("step 1", "answer")

    def test_think_in_user_text_stays(self) -> None:
        row = {
            "messages": [
                {"role": "user", "content": "<think>a</think>b"},
                {"role": "assistant", "content": "c"},
            ]
        }
        _, [conv], _ = _parse(row)
        assert conv.messages[0].content == "<think>a</think>b"

    def test_unknown_role_rejected(self) -> None:
        with pytest.raises(RowRejected) as exc:
            _parse({"messages": [{"role": "narrator", "content": "x"}]})
        assert exc.value.code == "unknown_role"
        assert "narrator" in exc.value.reason

    def test_extra_message_field_is_reported(self) -> None:
        _, _, warnings = _parse({"messages": [{"role": "user", "content": "x", "tokens_used": 3}]})
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
            _parse(row, images="reject")
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
        family, [conv], _ = _parse(row)
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
        _, [conv], _ = _parse(row)
        assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
        assert conv.messages[1].tool_calls[0].arguments == {"k": [1]}
        assert conv.tools == [{"name": "s"}]

    def test_tools_empty_string_list(self) -> None:
        _, [conv], warnings = _parse({"conversations": [{"from": "human", "value": "q"}], "tools": "[]"})
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
        _, [conv], _ = _parse(row)
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
        family, [conv], _ = _parse(row, tool_tags="keep")
        assert family == "sharegpt"
        assert conv.messages[1].content == xml
        assert conv.messages[1].reasoning == "plan"
        assert conv.messages[1].tool_calls == []
        family, [conv], _ = _parse(row)  # the default lifts the tags into a structured call
        assert family == "hermes"
        assert (conv.messages[1].content, conv.messages[1].reasoning) == ("", "plan")
        assert [(c.name, c.arguments) for c in conv.messages[1].tool_calls] == [("dim", {})]

    def test_role_content_under_conversations(self) -> None:
        row = {"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
        family, [conv], _ = _parse(row)
        assert family == "openai"
        assert [m.role for m in conv.messages] == ["user", "assistant"]

    def test_null_extra_turn_keys_are_not_reported(self) -> None:
        row = {"conversations": [{"from": "human", "value": "q", "markdown": None, "text": None}]}
        _, _, warnings = _parse(row)
        assert warnings == {}

    def test_unknown_from(self) -> None:
        with pytest.raises(RowRejected) as exc:
            _parse({"conversations": [{"from": "alien", "value": "x"}]})
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
        family, [conv], _ = _parse(row)
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
        family, [conv], _ = _parse({q: "Q", a: "A"})
        assert family == "query_response"
        assert [(m.role, m.content) for m in conv.messages] == [("user", "Q"), ("assistant", "A")]


class TestPromptOnly:
    @pytest.mark.parametrize(
        "row", [{"prompt": "p"}, {"question": "p"}, {"instruction": "p"}, {"turns": ["p"]}]
    )
    def test_prompt_shapes(self, row: dict[str, Any]) -> None:
        family, [conv], _ = _parse(row)
        assert family == "prompt"
        assert [(m.role, m.content) for m in conv.messages] == [("user", "p")]
        assert not conv.has_assistant

    def test_mt_bench_turns_become_user_turns(self) -> None:
        _, [conv], _ = _parse({"question_id": 81, "turns": ["a", "b"]})
        assert [m.role for m in conv.messages] == ["user", "user"]
        assert conv.meta == {"question_id": 81}


class TestTree:
    ROW = {
        "prompt": {
            "role": "prompter",
            "text": "Q",
            "replies": [
                {
                    "role": "assistant",
                    "text": "A1",
                    "rank": 1,
                    "replies": [
                        {
                            "role": "prompter",
                            "text": "Q2",
                            "replies": [{"role": "assistant", "text": "A3", "replies": []}],
                        }
                    ],
                },
                {"role": "assistant", "text": "A2", "rank": 0, "replies": []},
            ],
        }
    }

    def test_one_conversation_per_leaf(self) -> None:
        family, convs, _ = _parse(self.ROW)
        assert family == "tree"
        assert [[m.content for m in c.messages] for c in convs] == [["Q", "A1", "Q2", "A3"], ["Q", "A2"]]
        assert [c.source.path for c in convs] == ["0.0.0", "1"]

    def test_best_path_follows_lowest_rank(self) -> None:
        _, convs, _ = _parse(self.ROW, tree_paths="best")
        assert [[m.content for m in c.messages] for c in convs] == [["Q", "A2"]]


class TestTrajectory:
    def test_history_with_tool_call_ids_split_by_agent(self) -> None:
        row = {
            "history": [
                {"role": "user", "content": "fix", "agent": "main"},
                {
                    "role": "assistant",
                    "content": "look",
                    "agent": "main",
                    "tool_calls": [{"id": "t1", "function": {"name": "bash", "arguments": '{"c": "ls"}'}}],
                },
                {"role": "tool", "content": "a.py", "agent": "main", "tool_call_ids": ["t1"]},
                {"role": "user", "content": "review", "agent": "reviewer"},
                {"role": "assistant", "content": "ok", "agent": "reviewer"},
            ]
        }
        family, convs, _ = _parse(row)
        assert family == "trajectory"
        assert len(convs) == 2
        assert convs[0].messages[2].tool_call_id == "t1"
        assert [m.content for m in convs[1].messages] == ["review", "ok"]


class TestUnknown:
    def test_unknown_keys_are_named(self) -> None:
        with pytest.raises(RowRejected) as exc:
            _parse({"foo": 1, "bar": 2})
        assert exc.value.code == "unknown_format"
        assert "bar, foo" in exc.value.reason

    def test_messages_not_a_list(self) -> None:
        with pytest.raises(RowRejected) as exc:
            _parse({"messages": "hello"})
        assert exc.value.code == "unknown_format"
        assert "messages is a JSON str" in exc.value.reason

    def test_not_an_object(self) -> None:
        with pytest.raises(RowRejected) as exc:
            _parse([1, 2])  # type: ignore[arg-type]
        assert exc.value.code == "not_an_object"


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


FIXTURES = TEST_FIXTURES / "formats"


def _fixture_rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def _turns(conv: Any) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in conv.messages]


class TestShapesPeopleWrite:
    """Each shape read right, from the project's fixtures (each failed or read wrong before)."""

    def test_from_value_turns_under_messages(self) -> None:
        row = _fixture_rows("sharegpt_in_messages.jsonl")[0]
        family, [conv], warnings = _parse(row)
        assert family == "sharegpt"
        assert _turns(conv) == [
            ("system", "Be brief."),
            ("user", "Capital of France?"),
            ("assistant", "Paris."),
        ]
        assert warnings == {}

    def test_human_and_gpt_roles_inside_messages(self) -> None:
        row = _fixture_rows("sharegpt_in_messages.jsonl")[1]
        family, [conv], _ = _parse(row)
        assert family == "openai"
        assert _turns(conv) == [("user", "Two plus two?"), ("assistant", "Four.")]
        assert conv.meta == {"id": "r2"}

    def test_dolly_instruction_context_response(self) -> None:
        with_context, without = _fixture_rows("dolly.jsonl")
        family, [conv], _ = _parse(with_context)
        assert family == "instruction_response"  # was read as a prompt-only row, the answer dropped
        assert _turns(conv) == [
            ("user", f"{with_context['instruction']}\n{with_context['context']}"),
            ("assistant", with_context["response"]),
        ]
        assert conv.meta == {"category": "closed_qa"}
        _, [conv], _ = _parse(without)
        assert _turns(conv) == [("user", "Which is a species of fish? Tope or Rope"), ("assistant", "Tope")]

    def test_torchtune_input_output(self) -> None:
        family, [conv], _ = _parse(_fixture_rows("torchtune_input_output.jsonl")[0])
        assert family == "query_response"
        assert _turns(conv) == [("user", "Translate to French: good morning"), ("assistant", "Bonjour")]

    def test_ms_swift_human_assistant_pairs(self) -> None:
        first, second = _fixture_rows("swift_turn_pairs.jsonl")
        family, [conv], warnings = _parse(first)
        assert family == "turn_pairs"
        assert _turns(conv) == [
            ("system", "You are a helpful assistant."),
            ("user", "What is 1+1?"),
            ("assistant", "2"),
            ("user", "And 2+2?"),
            ("assistant", "4"),
        ]
        assert warnings == {}
        assert _turns(_parse(second)[1][0]) == [("user", "Name a colour."), ("assistant", "Blue.")]

    def test_pair_without_either_side_is_refused(self) -> None:
        with pytest.raises(RowRejected) as exc:
            _parse({"conversation": [{"human": "q", "assistant": "a"}, {"note": "x"}]})
        assert exc.value.code == "unknown_format" and "conversation[1]" in exc.value.reason

    def test_images_and_audio_are_refused_naming_what_was_found(self) -> None:
        llava, two_images, audio, no_media = _fixture_rows("multimodal.jsonl")
        for row, found in (
            (llava, ["image (1)", "1 <image>"]),
            (two_images, ["images (2)", "2 <image>"]),
            (audio, ["audios (1)", "1 <audio>"]),
        ):
            with pytest.raises(RowRejected) as exc:
                _parse(row, images="reject")
            assert exc.value.code == "multimodal_content"
            for text in found:
                assert text in exc.value.reason
        # images kept (the default): audio is still refused; the images are read, and not there
        for row, code, named in (
            (llava, "image_missing", "coco/train2017/000000033471.jpg"),
            (two_images, "image_missing", "a.jpg"),
            (audio, "multimodal_content", "audios (1)"),
        ):
            with pytest.raises(RowRejected) as exc:
                _parse(row)
            assert exc.value.code == code and named in exc.value.reason
        family, [conv], _ = _parse(no_media)  # an empty images list is a text row
        assert family == "openai" and conv.has_assistant


class TestForcedFormat:
    def test_forced_shape_reads_the_row_that_matches(self) -> None:
        # an ultrachat row holds prompt and messages: detection reads messages, --from prompt the prompt
        row = {
            "prompt": "p",
            "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
        }
        assert _parse(row)[0] == "openai"
        family, [conv], _ = _parse(row, from_format="prompt")
        assert family == "prompt" and _turns(conv) == [("user", "p")]

    def test_row_of_another_shape_is_rejected_naming_why(self) -> None:
        row = _fixture_rows("dolly.jsonl")[0]
        with pytest.raises(RowRejected) as exc:
            _parse(row, from_format="alpaca")
        assert exc.value.code == "format_mismatch"
        assert "not alpaca (which needs instruction and output)" in exc.value.reason
        assert "it reads as instruction_response" in exc.value.reason
        assert "context, instruction, response" in exc.value.reason
        with pytest.raises(RowRejected, match="it matches no known shape") as exc:
            _parse({"x": 1}, from_format="sharegpt")
        assert exc.value.code == "format_mismatch"

    def test_unknown_format_name_lists_the_known_ones(self) -> None:
        from draftdeck.convert import ConvertOptions
        from draftdeck.errors import UsageError

        with pytest.raises(
            UsageError,
            match="unknown input format 'llava'; known formats: openai, sharegpt",
        ):
            ConvertOptions(from_format="llava")
