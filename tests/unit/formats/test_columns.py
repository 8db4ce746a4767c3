# ruff: noqa: F811 - pytest fixtures imported from tokenize_helpers
"""A declared column mapping (--columns / --tags): shapes no reader can guess read into user, reasoning
and assistant turns; a row without a named field is format_mismatch naming it; a mapping that cannot
read any row is refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draftdeck.convert import ConvertOptions, convert
from draftdeck.errors import UsageError
from draftdeck.formats.common import ParseContext, ParseOptions, RowRejected
from draftdeck.formats.detect import parse
from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.support.tokenize import qwen_dir, qwen_tok, trained_runs  # noqa: F401

MEDICAL = {
    "Question": "A man of 45 has chest pain spreading to his left arm. What test comes first?",
    "Complex_CoT": "Chest pain spreading to the arm suggests a coronary syndrome: an ECG within ten minutes.",
    "Response": "An ECG, within ten minutes of arrival.",
    "question": "an unrelated question",
    "answer": "an unrelated answer",
}
MEDICAL_COLUMNS = {"prompt": "Question", "reasoning": "Complex_CoT", "response": "Response"}


def _read(row: dict[str, Any], columns: dict[str, str], tags: dict[str, str] | None = None) -> Any:
    options = ParseOptions(columns=tuple(columns.items()), tags=tuple((tags or {}).items()))
    family, [conv] = parse(row, ParseContext(options))
    assert family == "columns"
    return conv


def test_the_medical_shape_reads_into_user_reasoning_and_answer() -> None:
    conv = _read(MEDICAL, MEDICAL_COLUMNS)
    user, answer = conv.messages
    assert (user.role, user.content) == ("user", MEDICAL["Question"])
    assert (answer.role, answer.content, answer.reasoning) == (
        "assistant", MEDICAL["Response"], MEDICAL["Complex_CoT"],
    )  # fmt: skip
    # the detected question/answer pair beside it is not read: it stays in the row's meta
    assert conv.meta == {"question": "an unrelated question", "answer": "an unrelated answer"}


def test_seq2seq_rows_and_a_two_part_prompt_with_a_system() -> None:
    conv = _read({"src": "Translate: bonjour", "tgt": "hello", "sys": "You translate."},
                 {"prompt": "src", "response": "tgt", "system": "sys"})  # fmt: skip
    assert [(m.role, m.content) for m in conv.messages] == [
        ("system", "You translate."), ("user", "Translate: bonjour"), ("assistant", "hello"),
    ]  # fmt: skip
    conv = _read({"task": "Sum these", "nums": "2 and 3", "out": "5"},
                 {"prompt": "task", "query": "nums", "response": "out"})  # fmt: skip
    assert conv.messages[0].content == "Sum these\n2 and 3"  # LLaMA-Factory's joining


def test_a_messages_column_under_other_tags_with_a_call_and_its_result() -> None:
    row = {"dialog": [
        {"speaker": "asker", "text": "Weather in Oslo?"},
        {"speaker": "caller", "text": json.dumps({"name": "weather", "arguments": {"city": "Oslo"}})},
        {"speaker": "result", "text": '{"temp": 3}'},
        {"speaker": "helper", "text": "It is 3 degrees in Oslo."},
    ], "tools_json": [{"name": "weather", "parameters": {"type": "object"}}]}  # fmt: skip
    tags = {"role_tag": "speaker", "content_tag": "text", "user_tag": "asker", "assistant_tag": "helper",
            "function_tag": "caller", "observation_tag": "result"}  # fmt: skip
    conv = _read(row, {"messages": "dialog", "tools": "tools_json"}, tags)
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
    assert conv.messages[1].tool_calls[0].name == "weather" and conv.tools
    with pytest.raises(RowRejected) as exc:
        _read({"dialog": [{"speaker": "moderator", "text": "x"}]}, {"messages": "dialog"}, tags)
    assert exc.value.code == "format_mismatch" and "'moderator'" in exc.value.reason


def test_a_row_without_a_named_field_is_format_mismatch_naming_it() -> None:
    with pytest.raises(RowRejected) as exc:
        _read({"Question": "only a question"}, MEDICAL_COLUMNS)
    assert exc.value.code == "format_mismatch"
    assert "'Complex_CoT' (reasoning), 'Response' (response)" in exc.value.reason


@pytest.mark.parametrize(
    "columns,tags,said",
    [
        ({"answer": "tgt"}, {}, "--columns: unknown key answer"),
        ({"response": "tgt"}, {}, "--columns: name the user turn"),
        ({"messages": "m", "response": "r"}, {}, "--columns: messages=FIELD reads the whole conversation"),
        ({"prompt": "q"}, {"role_tag": "who"}, "--tags: they name the keys of a messages column"),
        ({"messages": "m"}, {"speaker": "who"}, "--tags: unknown key speaker"),
    ],
)
def test_a_mapping_that_cannot_read_is_refused(
    columns: dict[str, str], tags: dict[str, str], said: str
) -> None:
    with pytest.raises(UsageError, match=said):
        ConvertOptions(columns=columns, tags=tags)


def test_a_csv_converts_and_tokenizes_by_its_mapping_with_exact_masks(
    tmp_path: Path, qwen_dir: Path, qwen_tok: Any
) -> None:
    table = tmp_path / "med.csv"
    table.write_text(
        "Question,Complex_CoT,Response\n"
        f'"{MEDICAL["Question"]}","{MEDICAL["Complex_CoT"]}","{MEDICAL["Response"]}"\n'
        "a question with no answer,,\n",
        encoding="utf-8",
    )
    report = convert(
        [table], tmp_path / "med.jsonl", "openai", options=ConvertOptions(columns=MEDICAL_COLUMNS)
    )
    assert (report.rows_in, report.rows_out, dict(report.formats)) == (2, 1, {"columns": 2})
    assert report.rejected == {"empty_assistant_turn": 1}  # the empty answer, as any reader counts it
    written = [json.loads(line) for line in (tmp_path / "med.jsonl").read_text().splitlines()]
    assert written[0]["messages"][1]["reasoning_content"] == MEDICAL["Complex_CoT"]
    out = tmp_path / "ds"
    report = tokenize_files([table], out, TokenizeOptions(qwen_dir, workers=1, columns=MEDICAL_COLUMNS))
    report.check_accounting()
    assert (report.rows_out, dict(report.rejected)) == (1, {"empty_assistant_turn": 1})
    ds = ShardDataset(out)
    row = ds.row(0)
    [run] = trained_runs(qwen_tok, row["input_ids"], row["loss_mask"])
    # the reasoning and the answer are trained, the question is not
    assert MEDICAL["Complex_CoT"] in run and run.endswith(MEDICAL["Response"] + "<|im_end|>")
    assert MEDICAL["Question"] not in run


def test_a_long_field_no_reader_used_is_said_and_the_mapping_reads_it(tmp_path: Path) -> None:
    """Read by its question/answer pair, the row's long chain of thought and second answer would be
    kept out of training silently: unused_text_field names them; declared, they are read."""
    cot = "Step by step: " + "the pain pattern, the age and the risk factors point to the heart. " * 4
    row = {**MEDICAL, "Complex_CoT": cot}
    turns = [{"role": "user", "content": "x" * 250}, {"role": "assistant", "content": "a long enough answer"}]
    ultrachat = {"prompt": "x" * 250, "messages": turns}
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps(row) + "\n" + json.dumps(ultrachat) + "\n")
    for workers in (1, 2):  # the fast path hands such rows to the general one
        report = convert([src], tmp_path / f"o{workers}.jsonl", "openai",
                         options=ConvertOptions(workers=workers, chunk_bytes=64))  # fmt: skip
        assert report.warnings == {"unused_text_field": 1}  # ultrachat's prompt repeats its first turn
        [example] = report.examples["unused_text_field"]
        assert example.line == 1 and "'Complex_CoT' (" in example.reason and "--columns" in example.reason
    mapped = convert([src], tmp_path / "m.jsonl", "openai",
                     options=ConvertOptions(columns=MEDICAL_COLUMNS))  # fmt: skip
    assert "unused_text_field" not in mapped.warnings and mapped.rejected == {"format_mismatch": 1}
