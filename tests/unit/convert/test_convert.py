"""draftdeck.convert: row accounting, checks, policy, placeholder answers, duplicates, bad inputs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdeck.convert import ConvertOptions, check_conversation, convert, read_conversations
from draftdeck.errors import InputError, JobFailed, UsageError
from draftdeck.formats.model import Conversation, Message, ToolCall
from draftdeck.quality import Policy, Report
from tests.conftest import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "formats"


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _chat(user: str, answer: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def _read(paths: list[Path], **opts: Any) -> tuple[list[Conversation], Report]:
    report = Report()
    convs = list(read_conversations(paths, report, ConvertOptions(**opts)))
    report.rows_out = len(convs)
    report.check_accounting()
    return convs, report


class TestFixtures:
    def test_all_fixture_shapes_in_one_run(self, tmp_path: Path) -> None:
        paths = sorted(p for p in FIXTURES.iterdir() if p.name not in ("unknown_keys.jsonl",))
        report = convert(
            paths, tmp_path / "o.jsonl", "openai", options=ConvertOptions(allow_prompt_only=True)
        )
        # 4 alpaca + 5 bad_bytes + 9 openai + 4 prompts + 3 query/response + 9 sharegpt + 1 traj + 1 tree
        # + 2 dolly + 4 multimodal + 2 sharegpt-in-messages + 2 swift pairs + 2 torchtune input/output
        # + 6 medical question/answer pairs (their long Question / Complex_CoT / Response unused)
        assert report.rows_in == 54
        # the tree gives 2 conversations, the trajectory 2 (two agents)
        assert report.rows_expanded == 2
        assert dict(report.rejected) == {
            "empty_assistant_turn": 1,  # sharegpt.json's row 10: an empty gpt turn
            "encoding_error": 1,
            "json_error": 2,
            "not_an_object": 1,
            "multimodal_content": 1,  # audio
            "image_missing": 2,  # multimodal.jsonl's images are not there
        }
        assert dict(report.formats) == {
            "alpaca": 4,
            "instruction_response": 2,
            "openai": 13,
            "prompt": 4,
            "query_response": 11,
            "hermes": 1,
            "sharegpt": 8,
            "trajectory": 1,
            "tree": 1,
            "turn_pairs": 2,
        }
        assert report.rows_out == 48
        assert report.outputs[0].rows == 48

    def test_openai_fixture_checks(self) -> None:
        convs, report = _read([FIXTURES / "openai_mixed.jsonl"])
        assert len(convs) == 9
        # o2's loss_weight flags (0.0 on the user turn, 1.0 on the answer) are training flags now
        assert report.warnings == {"invalid_tool_arguments": 1}
        by_id = {c.meta["id"]: c for c in convs}
        assert by_id["o5"].messages[1].reasoning == "Let me think."
        assert by_id["o3"].tools == [{"name": "weather", "parameters": {"type": "object"}}]
        assert by_id["o8"].messages[-1].tool_calls[0].name == "f"

    def test_bad_bytes_each_row_counted_with_line(self) -> None:
        convs, report = _read([FIXTURES / "bad_bytes.jsonl"])
        assert len(convs) == 1
        lines = {code: [e.line for e in ex] for code, ex in report.examples.items()}
        assert lines == {"encoding_error": [2], "json_error": [3, 5], "not_an_object": [4]}
        assert "truncated" in report.examples["json_error"][1].reason


class TestChecks:
    def _conv(self, *msgs: Message) -> Conversation:
        return Conversation(list(msgs))

    def test_clean(self) -> None:
        assert check_conversation(self._conv(Message("user", "q"), Message("assistant", "a")), False) == []

    def test_no_user_and_no_assistant(self) -> None:
        codes = [c for c, _ in check_conversation(self._conv(Message("system", "s")), False)]
        assert codes == ["no_user_turn", "no_assistant_turn"]

    def test_prompt_only_allowed(self) -> None:
        assert check_conversation(self._conv(Message("user", "a"), Message("user", "b")), True) == []

    def test_trailing_user_and_non_alternating(self) -> None:
        conv = self._conv(
            Message("user", "q"), Message("assistant", "a"), Message("assistant", "b"), Message("user", "q2")
        )
        assert [c for c, _ in check_conversation(conv, False)] == ["trailing_user_turn", "non_alternating"]
        conv = self._conv(
            Message("user", "q"), Message("system", "s"), Message("user", "q2"), Message("assistant", "a")
        )
        assert dict(check_conversation(conv, False))["non_alternating"] == "messages 0 and 2 are both user"

    def test_tool_flow_is_clean_and_orphan_detected(self) -> None:
        call = ToolCall("f", {}, id="c1")
        ok = self._conv(
            Message("user", "q"),
            Message("assistant", "", tool_calls=[call]),
            Message("tool", "r", tool_call_id="c1"),
            Message("assistant", "done"),
        )
        assert check_conversation(ok, False) == []
        orphan = self._conv(
            Message("user", "q"),
            Message("assistant", "a"),
            Message("tool", "r", tool_call_id="zz"),
            Message("assistant", "b"),
        )
        issues = dict(check_conversation(orphan, False))
        assert "zz" in issues["orphan_tool_result"]

    def test_empty_turn_and_empty_conversation(self) -> None:
        conv = self._conv(
            Message("user", "q"), Message("assistant", " "), Message("user", "q"), Message("assistant", "a")
        )
        # an empty answer trains nothing but the end-of-turn tokens: its own code, rejected by default
        assert [c for c, _ in check_conversation(conv, False)] == ["empty_assistant_turn"]
        conv = self._conv(Message("system", " "), Message("user", "q"), Message("assistant", "a"))
        assert [c for c, _ in check_conversation(conv, False)] == ["empty_turn"]
        assert [c for c, _ in check_conversation(self._conv(Message("user", "")), False)] == [
            "empty_conversation"
        ]
        assert [c for c, _ in check_conversation(self._conv(), False)] == ["empty_conversation"]


class TestPolicy:
    def test_empty_output_always_fails_and_names_unknown_keys(self, tmp_path: Path) -> None:
        out = tmp_path / "o.jsonl"
        with pytest.raises(JobFailed) as exc:
            convert([FIXTURES / "unknown_keys.jsonl"], out, "sharegpt")
        assert "empty output" in str(exc.value)
        assert "bar, baz, foo" in str(exc.value)
        assert isinstance(exc.value.report, Report)
        assert exc.value.report.rejected == {"unknown_format": 2}
        assert not out.exists()

    def test_empty_file_fails(self, tmp_path: Path) -> None:
        empty = tmp_path / "e.jsonl"
        empty.write_bytes(b"")
        with pytest.raises(JobFailed) as exc:
            convert([empty], tmp_path / "o.jsonl", "openai")
        assert "empty output: no rows were written out of 0 read from" in str(exc.value)

    def test_strict_fails_on_warning_and_writes_nothing(self, tmp_path: Path) -> None:
        src = _jsonl(tmp_path / "i.jsonl", [_chat("q", "a one"), _chat("q", "a one")])
        with pytest.raises(JobFailed) as exc:
            convert([src], tmp_path / "o.jsonl", "openai", policy=Policy(strict=True))
        assert "duplicate_conversation" in str(exc.value)
        assert not (tmp_path / "o.jsonl").exists()
        report = convert([src], tmp_path / "o.jsonl", "openai")
        assert report.warnings == {"duplicate_conversation": 1}
        assert report.rows_out == 2
        # the warning names the record it repeats
        assert report.examples["duplicate_conversation"][0].reason == (
            "the same messages appeared earlier, at line 1"
        )

    def test_max_rejected(self, tmp_path: Path) -> None:
        src = _jsonl(tmp_path / "i.jsonl", [_chat("q", "fine answer"), {"foo": 1}, {"bar": 2}])
        with pytest.raises(JobFailed) as exc:
            convert([src], tmp_path / "o.jsonl", "openai", policy=Policy(max_rejected=0.5))
        assert "max-rejected" in str(exc.value)
        assert convert([src], tmp_path / "o.jsonl", "openai", policy=Policy(max_rejected=0.7)).rows_out == 1

    def test_policy_file_can_reject_a_warning_and_fail_fast(self, tmp_path: Path) -> None:
        src = _jsonl(tmp_path / "i.jsonl", [_chat("q", "a one"), _chat("q", "a one"), _chat("r", "b two")])
        pol = tmp_path / "p.json"
        pol.write_text(json.dumps({"codes": {"duplicate_conversation": "reject"}}))
        report = convert([src], tmp_path / "o.jsonl", "openai", policy=Policy.from_file(pol))
        assert (report.rows_out, dict(report.rejected)) == (2, {"duplicate_conversation": 1})
        pol.write_text(json.dumps({"codes": {"duplicate_conversation": "fail"}}))
        with pytest.raises(JobFailed) as exc:
            convert([src], tmp_path / "o.jsonl", "openai", policy=Policy.from_file(pol))
        assert "i.jsonl:2" in str(exc.value)
        assert isinstance(exc.value.report, Report)
        exc.value.report.check_accounting()

    def test_unknown_target_and_missing_input(self, tmp_path: Path) -> None:
        with pytest.raises(UsageError):
            convert([FIXTURES / "alpaca.json"], tmp_path / "o", "csv")
        with pytest.raises(InputError):
            convert([tmp_path / "missing.jsonl"], tmp_path / "o.jsonl", "openai")


class TestPlaceholder:
    def test_dummy_ok_answers_rejected_real_short_answers_kept(self, tmp_path: Path) -> None:
        rows = [_chat(f"prompt {i}", "OK.") for i in range(100)]
        rows += [_chat(f"what is {i}+{i}?", str(2 * i)) for i in range(50)]
        rows.insert(10, _chat("Say ok", "ok"))  # same normalised key: also a placeholder
        src = _jsonl(tmp_path / "i.jsonl", rows)
        convs, report = _read([src])
        assert report.rejected == {"placeholder_response": 101}
        assert len(convs) == 50
        assert "'ok'" in report.examples["placeholder_response"][0].reason

    def test_31_rows_of_ok_are_placeholders(self, tmp_path: Path) -> None:
        # a known filler needs only a few different prompts, far below the general 32
        rows = [_chat(f"question {i}?", "OK.") for i in range(31)]
        convs, report = _read([_jsonl(tmp_path / "i.jsonl", rows)])
        assert convs == [] and report.rejected == {"placeholder_response": 31}
        assert "known filler" in report.examples["placeholder_response"][0].reason

    @pytest.mark.parametrize("first", [True, False])
    def test_yes_to_40_questions_among_1000_rows_kept(self, tmp_path: Path, first: bool) -> None:
        yes = [_chat(f"Is {i} a whole number?", "Yes.") for i in range(40)]
        normal = [
            _chat(f"Explain topic {i}.", f"Topic {i} is explained at length here.") for i in range(1000)
        ]
        rows = yes + normal if first else normal[:500] + yes + normal[500:]
        convs, report = _read([_jsonl(tmp_path / "i.jsonl", rows)])
        assert not report.rejected and len(convs) == 1040  # 40 of 1,040 is no large share
        assert report.extra["placeholder"]["answers"] == []

    def test_real_answer_repeated_by_duplicated_data_is_a_duplicate(self, tmp_path: Path) -> None:
        same = _chat("Describe the color yellow in 3 words.", "Bright, cheerful, warm.")
        rows = [same] * 936 + [_chat(f"Explain topic {i}.", f"Topic {i} at length.") for i in range(64)]
        convs, report = _read([_jsonl(tmp_path / "i.jsonl", rows)])
        assert not report.rejected and len(convs) == 1000
        assert report.warnings == {"duplicate_conversation": 935}

    def test_one_short_answer_to_most_different_prompts_is_a_placeholder(self, tmp_path: Path) -> None:
        rows = [_chat(f"prompt {i}", "I cannot help with that.") for i in range(200)]
        rows += [_chat(f"Explain topic {i}.", f"Topic {i} at length.") for i in range(100)]
        convs, report = _read([_jsonl(tmp_path / "i.jsonl", rows)])
        assert report.rejected == {"placeholder_response": 200} and len(convs) == 100

    def test_thresholds_are_options(self, tmp_path: Path) -> None:
        yes = [_chat(f"Is {i} a whole number?", "Yes.") for i in range(40)]
        normal = [_chat(f"Explain topic {i}.", f"Topic {i} at length.") for i in range(1000)]
        _, report = _read([_jsonl(tmp_path / "a.jsonl", yes + normal)], placeholder_min_share=0.01)
        assert report.rejected == {"placeholder_response": 40}
        oks = [_chat(f"question {i}?", "OK.") for i in range(31)]
        convs, report = _read([_jsonl(tmp_path / "b.jsonl", oks)], placeholder_filler_rows=32)
        assert len(convs) == 31 and not report.rejected
        with pytest.raises(UsageError):
            ConvertOptions(placeholders="drop")

    def test_strip_makes_prompt_only_rows(self, tmp_path: Path) -> None:
        rows = [_chat(f"prompt {i}", "OK.") for i in range(200)]
        src = _jsonl(tmp_path / "i.jsonl", rows)
        out = tmp_path / "o.jsonl"
        report = convert([src], out, "sharegpt", options=ConvertOptions(placeholders="strip"))
        assert report.rows_out == 200 and not report.rejected
        assert report.warnings == {"placeholder_stripped": 200}
        lines = [orjson.loads(x) for x in out.read_bytes().splitlines()]
        assert lines[0] == {
            "conversations": [{"from": "human", "value": "prompt 0"}],
            "draftdeck_source": {"file": str(src), "row": 1},  # the padded row it came from
        }
        assert all(len(r["conversations"]) == 1 for r in lines)
        # and they read back as prompts, ready for regeneration
        convs, _ = _read([out], allow_prompt_only=True)
        assert len(convs) == 200 and not any(c.has_assistant for c in convs)

    def test_keep_keeps_them_with_a_warning(self, tmp_path: Path) -> None:
        rows = [_chat(f"prompt {i}", "OK.") for i in range(40)]
        convs, report = _read([_jsonl(tmp_path / "i.jsonl", rows)], placeholders="keep")
        assert len(convs) == 40 and report.warnings == {"placeholder_response": 40}
        assert convs[0].messages[-1].content == "OK."

    def test_below_threshold_kept_in_order_of_release(self, tmp_path: Path) -> None:
        rows = [_chat(f"prompt {i}", "Sure thing.") for i in range(10)]
        convs, report = _read([_jsonl(tmp_path / "i.jsonl", rows)])
        assert len(convs) == 10 and not report.rejected
        assert [c.messages[0].content for c in convs] == [f"prompt {i}" for i in range(10)]

    def test_buffer_overflow_counts_released_rows(self, tmp_path: Path) -> None:
        # not a filler: judged when its rows leave the 4-row buffer; the 32nd prompt flags it
        rows = [_chat(f"p{i}", "Sure thing.") for i in range(40)]
        convs, report = _read([_jsonl(tmp_path / "i.jsonl", rows)], placeholder_buffer=4)
        assert report.rejected == {"placeholder_response": 40 - 27}
        assert report.extra["placeholder"]["released_before_flag"] == 27
        assert len(convs) == 27

    def test_warn_policy_keeps_them(self, tmp_path: Path) -> None:
        rows = [_chat(f"prompt {i}", "OK.") for i in range(40)]
        from draftdeck.issue_codes import Action
        from draftdeck.quality import Rule

        opts = {"policy": Policy(rules={"placeholder_response": Rule(Action.WARN)})}
        convs, report = _read([_jsonl(tmp_path / "i.jsonl", rows)], **opts)
        assert len(convs) == 40 and report.warnings == {"placeholder_response": 40}

    def test_answers_with_reasoning_are_no_candidates(self, tmp_path: Path) -> None:
        rows = [
            {"messages": [{"role": "user", "content": f"q{i}"},
                          {"role": "assistant", "content": "OK.", "reasoning_content": f"think {i}"}]}
            for i in range(40)
        ]  # fmt: skip
        convs, report = _read([_jsonl(tmp_path / "i.jsonl", rows)])
        assert len(convs) == 40 and not report.rejected


class TestEmptyAnswer:
    def test_empty_assistant_turn_rejected_by_default(self, tmp_path: Path) -> None:
        # the shape of axolotl's conversation.missingturns.json (in the shared real files)
        turns = [("human", "q1"), ("gpt", ""), ("human", "q2"), ("gpt", "a2")]
        row = {"conversations": [{"from": f, "value": v} for f, v in turns]}
        src = _jsonl(tmp_path / "i.jsonl", [row, _chat("q", "a full answer")])
        convs, report = _read([src])
        assert len(convs) == 1 and report.rejected == {"empty_assistant_turn": 1}
        assert "assistant message 1" in report.examples["empty_assistant_turn"][0].reason
        from draftdeck.issue_codes import Action
        from draftdeck.quality import Rule

        convs, report = _read([src], policy=Policy(rules={"empty_assistant_turn": Rule(Action.WARN)}))
        assert len(convs) == 2 and report.warnings == {"empty_assistant_turn": 1}

    def test_tool_call_with_empty_text_is_not_empty(self, tmp_path: Path) -> None:
        conv = Conversation(
            [Message("user", "q"), Message("assistant", "", tool_calls=[ToolCall("f", {}, id="c")]),
             Message("tool", "r", tool_call_id="c"), Message("assistant", "done")]
        )  # fmt: skip
        assert check_conversation(conv, False) == []


class TestLosses:
    def test_losses_reported_with_thresholds(self, tmp_path: Path) -> None:
        rows = [_chat("q", "the same long answer")] * 10 + [{"unknown": 1}] * 2
        pol = Policy(max_rejected=0.5, alert_rejected=0.05, alert_duplicated=0.05)
        report = convert([_jsonl(tmp_path / "i.jsonl", rows)], tmp_path / "o.jsonl", "openai", policy=pol)
        losses = report.extra["losses"]
        assert losses["rejected"]["rows"] == 2 and losses["rejected"]["fail_above"] == 0.5
        assert "2 of 12 rows rejected (16.7%)" in losses["rejected"]["alert"]
        assert losses["duplicated"]["rows"] == 9 and "alert" in losses["duplicated"]
        assert "alert" not in losses["truncated"]
        assert [k for k, _ in pol.loss_alerts(report)] == ["high_rejected", "high_duplicated"]

    def test_5_of_6_rejected_fails_at_the_default_half(self, tmp_path: Path) -> None:
        from draftdeck.convert.job import ConvertParams, convert_files

        src = _jsonl(tmp_path / "i.jsonl", [_chat("q", "an answer")] + [{"unknown": i} for i in range(5)])
        params = ConvertParams(inputs=[str(src)], to="openai")
        with pytest.raises(JobFailed) as exc:
            convert_files(params, tmp_path / "o.jsonl")
        assert "5 of 6 rows rejected (83.3%)" in str(exc.value)
        assert not (tmp_path / "o.jsonl").exists()
        ok = ConvertParams(inputs=[str(src)], to="openai", max_rejected=0.9)
        assert convert_files(ok, tmp_path / "o.jsonl").rows_out == 1


class TestInputs:
    def test_oversize_row_of_100_mb(self, tmp_path: Path) -> None:
        big = tmp_path / "big.jsonl"
        with big.open("wb") as f:
            f.write(orjson.dumps(_chat("small", "fine answer")) + b"\n")
            f.write(b'{"messages": [{"role": "user", "content": "')
            chunk = b"x" * (1 << 20)
            for _ in range(100):
                f.write(chunk)
            f.write(b'"}, {"role": "assistant", "content": "y"}]}\n')
            f.write(orjson.dumps(_chat("after", "also fine")) + b"\n")
        convs, report = _read([big])
        assert [c.messages[0].content for c in convs] == ["small", "after"]
        assert report.rejected == {"oversize_row": 1}
        assert "104,857,6" in report.examples["oversize_row"][0].reason
        assert report.examples["oversize_row"][0].line == 2

    def test_gzip_and_json_object_inputs(self, tmp_path: Path) -> None:
        gz = tmp_path / "a.jsonl.gz"
        gz.write_bytes(gzip.compress(orjson.dumps(_chat("q", "gz answer")) + b"\n"))
        obj = tmp_path / "b.json"
        obj.write_text(
            json.dumps(
                {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "obj answer"}]},
                indent=2,
            )
        )
        convs, _ = _read([gz, obj])
        assert [c.messages[1].content for c in convs] == ["gz answer", "obj answer"]


# -- property tests: nothing crashes, every row is accounted ------------------------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "messages",
                    "conversations",
                    "role",
                    "content",
                    "from",
                    "value",
                    "tool_calls",
                    "instruction",
                    "output",
                    "prompt",
                    "replies",
                    "text",
                    "history",
                    "turns",
                    "tools",
                    "system",
                    "function",
                    "arguments",
                    "name",
                    "x",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(json_values, max_size=8))
def test_random_json_rows_accounted(rows: list[Any], tmp_path: Path) -> None:
    src = tmp_path / "r.jsonl"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    report = Report()
    n = sum(1 for _ in read_conversations([src], report, ConvertOptions(allow_prompt_only=True)))
    report.rows_out = n
    report.check_accounting()
    assert report.rows_in == len(rows)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_files_accounted(data: st.DataObject, tmp_path: Path) -> None:
    base = (
        FIXTURES / data.draw(st.sampled_from(["openai_mixed.jsonl", "sharegpt.json", "tree.jsonl"]))
    ).read_bytes()
    raw = bytearray(base)
    for _ in range(data.draw(st.integers(0, 5))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(raw)))
    src = tmp_path / ("c.json" if base.startswith(b"[") else "c.jsonl")
    src.write_bytes(bytes(raw[:cut]))
    report = Report()
    n = sum(1 for _ in read_conversations([src], report, ConvertOptions(allow_prompt_only=True)))
    report.rows_out = n
    report.check_accounting()
