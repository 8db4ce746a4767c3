"""Every file of ../shared/datasets/real/ converts with the expected counts and formats.

Expected counts were derived once by reading the files with plain `json` (not DraftDeck):
record counts are `len(json.load(f))` or the non-blank JSONL lines; duplicates are repeated
(instruction+input, output) pairs / repeated `conversations` lists; the other numbers are noted per file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from draftdeck.convert import ConvertOptions, convert
from draftdeck.quality import Report
from tests.conftest import real_file

# name: (rows_in, rows_out, formats, rejected, warnings)
EXPECTED: dict[str, tuple[int, int, dict[str, int], dict[str, int], dict[str, int]]] = {
    # 80 lines of `turns: [str, str]` with no answers: prompt-only, rejected unless allowed.
    "EAGLE__mt_bench__question.jsonl": (80, 0, {"prompt": 80}, {"no_assistant_turn": 80}, {}),
    # 500 ShareGPT records, all distinct conversations.
    "FastChat__dummy_conversation.json": (500, 500, {"sharegpt": 500}, {}, {}),
    # 500 records, 6 with a top-level system.
    "FastChat__dummy_conversation_with_system.json": (500, 500, {"sharegpt": 500}, {}, {}),
    # 999 alpaca records, 14 repeated (instruction+input, output) pairs.
    "LLaMA-Factory__alpaca_en_demo.json": (999, 999, {"alpaca": 999}, {}, {"duplicate_conversation": 14}),
    # 300 records, tools as JSON text (109 of them "[]"), 153 with function_call turns; 38 repeated.
    "LLaMA-Factory__glaive_toolcall_en_demo.json": (
        300,
        300,
        {"sharegpt": 300},
        {},
        {"duplicate_conversation": 38},
    ),
    "LLaMA-Factory__identity.json": (91, 91, {"alpaca": 91}, {}, {}),
    # 50 records of typed parts (text/reasoning/tool_call); 11 end on a tool call with no result: kept.
    "LLaMA-Factory__reason_tool_use_demo_50.jsonl": (50, 50, {"openai": 50}, {}, {}),
    # 10 records separated by blank lines, no final newline.
    "LLaMA-Factory__training_data.jsonl": (10, 10, {"openai": 10}, {}, {}),
    # 500 records, every message has `loss_weight` (0.0 on user turns, 1.0 on answers: training
    # flags, kept as `weight`); 1 repeated.
    "LLaMA-Factory__v1_sft_demo.jsonl": (500, 500, {"openai": 500}, {}, {"duplicate_conversation": 1}),
    # 1 record, OpenAI messages under `conversations`; call_222's arguments are cut JSON.
    "SpecForge__tool_use_conversation.jsonl": (1, 1, {"openai": 1}, {}, {"invalid_tool_arguments": 1}),
    "axolotl__alpaca.json": (2, 2, {"alpaca": 2}, {}, {}),
    # a single JSON object, not a list
    "axolotl__conversation.json": (1, 1, {"sharegpt": 1}, {}, {}),
    # the second turn is an empty gpt value: nothing to train on there, the row is rejected
    "axolotl__conversation.missingturns.json": (1, 0, {"sharegpt": 1}, {"empty_assistant_turn": 1}, {}),
    "speculators__dolphin_reasoning.jsonl": (1, 1, {"sharegpt": 1}, {}, {}),
    "speculators__gsm8k_singleturn.jsonl": (1, 1, {"query_response": 1}, {}, {}),
    # <tool_call> XML inside gpt text, answered by <tool_response> in `tool` turns: lifted into
    # structured calls and tool messages; no orphan, no alternation warning.
    "speculators__hermes_toolcall.jsonl": (1, 1, {"hermes": 1}, {}, {}),
    # extra `markdown`/`text` keys per turn, all null: nothing lost, nothing reported.
    "speculators__sharegpt_multiturn.jsonl": (1, 1, {"sharegpt": 1}, {}, {}),
    # `prompt` + `messages`: messages win.
    "speculators__ultrachat_messages.jsonl": (1, 1, {"openai": 1}, {}, {}),
    "torchtune__alpaca_tiny.json": (100, 100, {"alpaca": 100}, {}, {}),
    "torchtune__chat_tiny.json": (1, 1, {"sharegpt": 1}, {}, {}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_file_converts(name: str, tmp_path: Path) -> None:
    path = real_file(name)
    rows_in, rows_out, formats, rejected, warnings = EXPECTED[name]
    out = tmp_path / "out.jsonl"
    if rows_out == 0:
        from draftdeck.errors import JobFailed

        with pytest.raises(JobFailed) as exc:
            convert([path], out, "sharegpt")
        report: Any = exc.value.report
        assert "empty output" in str(exc.value)
        assert not out.exists()
    else:
        report = convert([path], out, "sharegpt")
        lines = out.read_bytes().splitlines()
        assert len(lines) == rows_out
        assert all("conversations" in orjson.loads(line) for line in lines)
    assert (report.rows_in, report.rows_out) == (rows_in, rows_out)
    assert dict(report.formats) == formats
    assert dict(report.rejected) == rejected
    assert dict(report.warnings) == warnings


def test_mt_bench_prompts_yielded_when_allowed(tmp_path: Path) -> None:
    path = real_file("EAGLE__mt_bench__question.jsonl")
    report = convert([path], tmp_path / "p.jsonl", "openai", options=ConvertOptions(allow_prompt_only=True))
    assert report.rows_out == 80
    first = orjson.loads((tmp_path / "p.jsonl").read_bytes().splitlines()[0])
    assert [m["role"] for m in first["messages"]] == ["user", "user"]
    assert first["question_id"] == 81


def test_reason_tool_use_parts(tmp_path: Path) -> None:
    path = real_file("LLaMA-Factory__reason_tool_use_demo_50.jsonl")
    convert([path], tmp_path / "o.jsonl", "openai")
    rows = [orjson.loads(line) for line in (tmp_path / "o.jsonl").read_bytes().splitlines()]
    last = [r["messages"][-1] for r in rows]
    assert sum(1 for m in last if m.get("tool_calls")) == 11
    assert all(m.get("reasoning_content") for r in rows for m in r["messages"] if m["role"] == "assistant")
    # tools are JSON text in the file; 48 hold definitions, 2 are "[]" (and then left out)
    assert sum(1 for r in rows if isinstance(r.get("tools"), list) and r["tools"]) == 48


def test_all_real_files_in_one_run(tmp_path: Path) -> None:
    paths = [real_file(n) for n in sorted(EXPECTED)]
    report = convert(paths, tmp_path / "all.parquet", "parquet")
    assert report.rows_in == sum(v[0] for v in EXPECTED.values())
    assert report.rows_out == sum(v[1] for v in EXPECTED.values())
    assert report.outputs[0].rows == report.rows_out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_file_scans_as_convert_would_read_it(name: str) -> None:
    """scan's pre-flight is convert's verdict: the same rows kept, rejected and warned, per shape."""
    from draftdeck.convert.scan import scan_file

    rows_in, rows_out, formats, rejected, warnings = EXPECTED[name]
    if rows_out == 0:  # a pre-flight after which convert would keep nothing fails, with its report
        from draftdeck.errors import JobFailed

        with pytest.raises(JobFailed, match="convert would keep none") as exc:
            scan_file(real_file(name))
        assert isinstance(exc.value.report, Report)
        report = exc.value.report
    else:
        report = scan_file(real_file(name))
    assert (report.rows_in, report.rows_out, report.extra["would_keep"]) == (rows_in, rows_out, rows_out)
    assert dict(report.formats) == formats
    assert dict(report.rejected) == rejected
    assert dict(report.warnings) == warnings
    assert report.extra["prompt_only"] == rejected.get("no_assistant_turn", 0)
    assert sum(item["rows"] for item in report.extra["would_reject"]) == sum(rejected.values())
    assert sum(ks["rows"] for ks in report.extra["keysets"]) == rows_in


def test_forcing_a_shape_on_real_files(tmp_path: Path) -> None:
    chat = real_file("torchtune__chat_tiny.json")
    report = convert([chat], tmp_path / "a.jsonl", "openai", options=ConvertOptions(from_format="sharegpt"))
    assert (report.rows_out, dict(report.formats)) == (1, {"sharegpt": 1})
    from draftdeck.convert.scan import scan_file
    from draftdeck.errors import JobFailed

    with pytest.raises(JobFailed, match="convert would keep none of the 500 rows") as exc:
        scan_file(real_file("FastChat__dummy_conversation.json"), from_format="alpaca")
    scanned = exc.value.report
    assert isinstance(scanned, Report)
    assert (scanned.rows_out, dict(scanned.rejected)) == (0, {"format_mismatch": 500})
    [item] = scanned.extra["would_reject"]
    assert (
        "not alpaca (which needs instruction and output): it reads as sharegpt" in item["example"]["reason"]
    )


def test_the_real_folder_as_one_input_reads_every_data_file(tmp_path: Path) -> None:
    """The folder a user points at (it holds PROVENANCE.md too) is its data files, read in name order:
    the same rows as the files given one by one."""
    from tests.conftest import REAL_DATA

    real_file("PROVENANCE.md")  # skips, saying why, where ../shared is absent
    report = convert([REAL_DATA], tmp_path / "all.parquet", "parquet")
    assert report.rows_in == sum(v[0] for v in EXPECTED.values())
    assert report.rows_out == sum(v[1] for v in EXPECTED.values())
    assert {Path(s.file).name for e in report.examples.values() for s in e} <= set(EXPECTED)
