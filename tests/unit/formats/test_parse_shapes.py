"""Parsing the shapes beyond one family's plain rows (draftdeck.formats.*): message trees, agent
trajectories, rows no known shape matches, the shapes people write (the project's fixtures) and a
shape forced with --from. test_parse.py holds each family's own rows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from draftdeck.formats.common import RowRejected
from tests.conftest import FIXTURES as TEST_FIXTURES
from tests.unit.formats.reading import parse_row


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
        family, convs, _ = parse_row(self.ROW)
        assert family == "tree"
        assert [[m.content for m in c.messages] for c in convs] == [["Q", "A1", "Q2", "A3"], ["Q", "A2"]]
        assert [c.source and c.source.path for c in convs] == ["0.0.0", "1"]

    def test_best_path_follows_lowest_rank(self) -> None:
        _, convs, _ = parse_row(self.ROW, tree_paths="best")
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
        family, convs, _ = parse_row(row)
        assert family == "trajectory"
        assert len(convs) == 2
        assert convs[0].messages[2].tool_call_id == "t1"
        assert [m.content for m in convs[1].messages] == ["review", "ok"]


class TestUnknown:
    def test_unknown_keys_are_named(self) -> None:
        with pytest.raises(RowRejected) as exc:
            parse_row({"foo": 1, "bar": 2})
        assert exc.value.code == "unknown_format"
        assert "bar, foo" in exc.value.reason

    def test_messages_not_a_list(self) -> None:
        with pytest.raises(RowRejected) as exc:
            parse_row({"messages": "hello"})
        assert exc.value.code == "unknown_format"
        assert "messages is a JSON str" in exc.value.reason

    def test_not_an_object(self) -> None:
        with pytest.raises(RowRejected) as exc:
            parse_row([1, 2])  # type: ignore[arg-type]
        assert exc.value.code == "not_an_object"


FIXTURES = TEST_FIXTURES / "formats"


def _fixture_rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def _turns(conv: Any) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in conv.messages]


class TestShapesPeopleWrite:
    """Each shape read right, from the project's fixtures (each failed or read wrong before)."""

    def test_from_value_turns_under_messages(self) -> None:
        row = _fixture_rows("sharegpt_in_messages.jsonl")[0]
        family, [conv], warnings = parse_row(row)
        assert family == "sharegpt"
        assert _turns(conv) == [
            ("system", "Be brief."),
            ("user", "Capital of France?"),
            ("assistant", "Paris."),
        ]
        assert warnings == {}

    def test_human_and_gpt_roles_inside_messages(self) -> None:
        row = _fixture_rows("sharegpt_in_messages.jsonl")[1]
        family, [conv], _ = parse_row(row)
        assert family == "openai"
        assert _turns(conv) == [("user", "Two plus two?"), ("assistant", "Four.")]
        assert conv.meta == {"id": "r2"}

    def test_dolly_instruction_context_response(self) -> None:
        with_context, without = _fixture_rows("dolly.jsonl")
        family, [conv], _ = parse_row(with_context)
        assert family == "instruction_response"  # was read as a prompt-only row, the answer dropped
        assert _turns(conv) == [
            ("user", f"{with_context['instruction']}\n{with_context['context']}"),
            ("assistant", with_context["response"]),
        ]
        assert conv.meta == {"category": "closed_qa"}
        _, [conv], _ = parse_row(without)
        assert _turns(conv) == [("user", "Which is a species of fish? Tope or Rope"), ("assistant", "Tope")]

    def test_torchtune_input_output(self) -> None:
        family, [conv], _ = parse_row(_fixture_rows("torchtune_input_output.jsonl")[0])
        assert family == "query_response"
        assert _turns(conv) == [("user", "Translate to French: good morning"), ("assistant", "Bonjour")]

    def test_ms_swift_human_assistant_pairs(self) -> None:
        first, second = _fixture_rows("swift_turn_pairs.jsonl")
        family, [conv], warnings = parse_row(first)
        assert family == "turn_pairs"
        assert _turns(conv) == [
            ("system", "You are a helpful assistant."),
            ("user", "What is 1+1?"),
            ("assistant", "2"),
            ("user", "And 2+2?"),
            ("assistant", "4"),
        ]
        assert warnings == {}
        assert _turns(parse_row(second)[1][0]) == [("user", "Name a colour."), ("assistant", "Blue.")]

    def test_pair_without_either_side_is_refused(self) -> None:
        with pytest.raises(RowRejected) as exc:
            parse_row({"conversation": [{"human": "q", "assistant": "a"}, {"note": "x"}]})
        assert exc.value.code == "unknown_format" and "conversation[1]" in exc.value.reason

    def test_images_and_audio_are_refused_naming_what_was_found(self) -> None:
        llava, two_images, audio, no_media = _fixture_rows("multimodal.jsonl")
        for row, found in (
            (llava, ["image (1)", "1 <image>"]),
            (two_images, ["images (2)", "2 <image>"]),
            (audio, ["audios (1)", "1 <audio>"]),
        ):
            with pytest.raises(RowRejected) as exc:
                parse_row(row, images="reject")
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
                parse_row(row)
            assert exc.value.code == code and named in exc.value.reason
        family, [conv], _ = parse_row(no_media)  # an empty images list is a text row
        assert family == "openai" and conv.has_assistant


class TestForcedFormat:
    def test_forced_shape_reads_the_row_that_matches(self) -> None:
        # an ultrachat row holds prompt and messages: detection reads messages, --from prompt the prompt
        row = {
            "prompt": "p",
            "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
        }
        assert parse_row(row)[0] == "openai"
        family, [conv], _ = parse_row(row, from_format="prompt")
        assert family == "prompt" and _turns(conv) == [("user", "p")]

    def test_row_of_another_shape_is_rejected_naming_why(self) -> None:
        row = _fixture_rows("dolly.jsonl")[0]
        with pytest.raises(RowRejected) as exc:
            parse_row(row, from_format="alpaca")
        assert exc.value.code == "format_mismatch"
        assert "not alpaca (which needs instruction and output)" in exc.value.reason
        assert "it reads as instruction_response" in exc.value.reason
        assert "context, instruction, response" in exc.value.reason
        with pytest.raises(RowRejected, match="it matches no known shape") as exc:
            parse_row({"x": 1}, from_format="sharegpt")
        assert exc.value.code == "format_mismatch"

    def test_unknown_format_name_lists_the_known_ones(self) -> None:
        from draftdeck.convert import ConvertOptions
        from draftdeck.errors import UsageError

        with pytest.raises(
            UsageError,
            match="unknown input format 'llava'; known formats: openai, sharegpt",
        ):
            ConvertOptions(from_format="llava")
