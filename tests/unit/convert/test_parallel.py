"""draftdeck.convert with worker processes: the same bytes and the same report as one process.

Every comparison runs both paths on the same input: ``workers=1`` (all in this process) and
``workers=2`` with small ranges, so that files are cut into many chunks and rows cross chunk edges.
(test_fast_path.py compares ``workers=1`` with read_conversations + Writer, the general path;
test_parallel_workers.py holds the chunk edges, the worker processes' lifecycle and the fast path.)
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from draftdeck.convert import ConvertOptions, convert
from draftdeck.errors import JobFailed
from draftdeck.issue_codes import Action
from draftdeck.quality import Policy, Report, Rule
from tests.conftest import FIXTURES as TEST_FIXTURES
from tests.conftest import real_file
from tests.support.convert_parallel import chat_row, comparable, convert_both, mixed_file

FIXTURES = TEST_FIXTURES / "formats"
REAL_JSONL = [
    "EAGLE__mt_bench__question.jsonl",
    "LLaMA-Factory__reason_tool_use_demo_50.jsonl",
    "LLaMA-Factory__training_data.jsonl",
    "LLaMA-Factory__v1_sft_demo.jsonl",
    "SpecForge__tool_use_conversation.jsonl",
    "speculators__dolphin_reasoning.jsonl",
    "speculators__gsm8k_singleturn.jsonl",
    "speculators__hermes_toolcall.jsonl",
    "speculators__sharegpt_multiturn.jsonl",
    "speculators__ultrachat_messages.jsonl",
]
REAL_JSON = [
    "FastChat__dummy_conversation.json",
    "LLaMA-Factory__glaive_toolcall_en_demo.json",
    "LLaMA-Factory__alpaca_en_demo.json",
    "torchtune__chat_tiny.json",
]


# -- equality on real files and generated files --------------------------------------------------------
@pytest.mark.parametrize("to", ["sharegpt", "openai"])
def test_real_files_same_bytes_and_report(tmp_path: Path, to: str) -> None:
    paths = [real_file(n) for n in REAL_JSONL] + [real_file(n) for n in REAL_JSON]
    one, two = convert_both(tmp_path, paths, to, chunk_bytes=4096)
    assert one.rows_in > 300
    assert two.extra["parallel"]["chunks"] > 20  # the JSONL files really went through the workers


def test_real_files_one_at_a_time_with_tiny_chunks(tmp_path: Path) -> None:
    for name in REAL_JSONL:
        one, _ = convert_both(tmp_path, [real_file(name)], chunk_bytes=700, allow_prompt_only=True)
        one.check_accounting()


def test_own_fixtures_same_bytes_and_report(tmp_path: Path) -> None:
    paths = sorted(p for p in FIXTURES.iterdir() if p.name != "unknown_keys.jsonl")
    one, two = convert_both(tmp_path, paths, "openai", chunk_bytes=256, allow_prompt_only=True)
    assert one.rows_in == 54
    assert (one.rejected["multimodal_content"], one.rejected["image_missing"]) == (1, 2)
    assert two.extra["parallel"]["chunks"] >= 3


def test_vendor_fixtures_same_bytes_and_report(tmp_path: Path) -> None:
    """Anthropic, Gemini, glaive, Hermes, preference rows and training flags: the workers read them
    as the parent does (the general path: none is a plain row)."""
    vendors = FIXTURES.parent / "vendors"
    paths = sorted(vendors.iterdir())
    for to in ("openai", "sharegpt"):
        one, two = convert_both(tmp_path, paths, to, chunk_bytes=512)
        assert one.rows_in == 35 and one.formats["anthropic"] == 4
        assert two.extra["parallel"]["chunks"] >= 8


def test_generated_mixed_file(tmp_path: Path) -> None:
    src = mixed_file(tmp_path / "mixed.jsonl", tail=b'{"messages": [{"role": "user"')  # truncated last line
    one, two = convert_both(
        tmp_path, [src], chunk_bytes=3000, placeholder_min_rows=4, placeholder_min_share=0.0,
        placeholder_buffer=4,
    )  # fmt: skip
    # every path of the parent is taken: duplicates, placeholders (flagged late, after buffer overflow),
    # reserved fields, rejected and failed rows, blank lines, trees
    assert one.warnings["duplicate_conversation"] > 10
    assert one.rejected["placeholder_response"] > 10
    assert one.warnings["unrepresentable_field"] > 10
    assert one.extra["placeholder"]["released_before_flag"] > 0
    for code in ("json_error", "encoding_error", "not_an_object", "unknown_format", "no_user_turn"):
        assert one.rejected[code] > 0, code
    assert one.rows_expanded > 0
    assert one.warnings["invalid_tool_arguments"] > 0
    assert two.extra["parallel"]["chunks"] > 20


def test_truncated_last_line_is_named(tmp_path: Path) -> None:
    """A last line with no newline that fails to parse says it is truncated, read by the parent and by
    a worker from the last of several chunks alike. Apart from the mixed file: its other JSON errors
    fill the examples kept per code before its last line is read."""
    src = tmp_path / "truncated.jsonl"
    rows = b"".join(orjson.dumps(chat_row(f"question {i}", f"answer {i} " * 4)) + b"\n" for i in range(30))
    src.write_bytes(rows + b'{"messages": [{"role": "user"')
    one, two = convert_both(tmp_path, [src], chunk_bytes=512)
    assert two.extra["parallel"]["chunks"] > 2
    assert one.rows_out == 30 and one.rejected["json_error"] == 1
    (example,) = one.examples["json_error"]
    assert example.line == 31
    assert example.reason.endswith("(the last line is truncated)"), example.reason


def test_generated_mixed_file_other_options(tmp_path: Path) -> None:
    src = mixed_file(tmp_path / "mixed.jsonl", n=800, seed=11)
    policy = Policy(rules={"duplicate_conversation": Rule(Action.REJECT), "empty_turn": Rule(Action.REJECT)})
    convert_both(tmp_path, [src], "openai", chunk_bytes=1500, allow_prompt_only=True, policy=policy)
    convert_both(tmp_path, [src], "sharegpt", chunk_bytes=5000, check_duplicates=False, tree_paths="best")


@pytest.mark.parametrize("mode", ["strip", "keep"])
def test_placeholder_modes_same_bytes_and_report(tmp_path: Path, mode: str) -> None:
    src = mixed_file(tmp_path / "mixed.jsonl", n=1500, seed=3)
    for to in ("sharegpt", "openai"):
        one, _ = convert_both(tmp_path, [src], to, chunk_bytes=2500, placeholders=mode, placeholder_buffer=8)
        code = "placeholder_stripped" if mode == "strip" else "placeholder_response"
        assert one.warnings[code] > 10 and not one.rejected["placeholder_response"]


def test_several_inputs_share_duplicates_and_placeholders(tmp_path: Path) -> None:
    a = mixed_file(tmp_path / "a.jsonl", n=400, seed=1)
    b = mixed_file(tmp_path / "b.jsonl", n=400, seed=1)  # the same rows again: all duplicates
    small = tmp_path / "small.jsonl"  # below one chunk: read in the parent, between two parallel files
    small.write_bytes(
        orjson.dumps(chat_row("dup question 1", "the same long answer every time, long enough")) + b"\n"
    )
    one, _ = convert_both(tmp_path, [a, small, b], chunk_bytes=2000, placeholder_min_rows=3)
    assert one.warnings["duplicate_conversation"] > 200


def test_a_duplicate_names_the_record_it_repeats(tmp_path: Path) -> None:
    rows = b"".join(
        orjson.dumps(chat_row(f"question {i}", f"a long enough answer {i}")) + b"\n" for i in range(300)
    )
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(rows + rows[: rows.index(b"\n") + 1])  # line 301 repeats line 1
    b.write_bytes(rows)  # every row repeats a's
    one, _ = convert_both(tmp_path, [a, b], chunk_bytes=2000)
    reasons = {(e.file, e.line): e.reason for e in one.examples["duplicate_conversation"]}
    assert reasons[(str(a), 301)] == "the same messages appeared earlier, at line 1"
    assert reasons[(str(b), 1)] == f"the same messages appeared earlier, at {a}:1"


@pytest.mark.parametrize("code", ["invalid_tool_arguments", "duplicate_conversation", "json_error"])
def test_policy_failure_at_the_same_row(tmp_path: Path, code: str) -> None:
    """A fail code stops both paths at the same row, with the same report (rows held for the
    placeholder check written, so that it balances) and no output file."""
    src = mixed_file(tmp_path / "mixed.jsonl", n=600, seed=5)
    policy = Policy(rules={code: Rule(Action.FAIL)})
    failures = []
    for workers in (1, 2):
        opts = ConvertOptions(workers=workers, chunk_bytes=500, policy=policy, placeholder_min_rows=50)
        with pytest.raises(JobFailed) as exc:
            convert([src], tmp_path / f"f{workers}.jsonl", "sharegpt", options=opts)
        assert not (tmp_path / f"f{workers}.jsonl").exists()
        assert isinstance(exc.value.report, Report)
        exc.value.report.check_accounting()
        failures.append((str(exc.value), comparable(exc.value.report)))
    assert failures[0] == failures[1]
    assert f"{code} at " in failures[0][0]
    assert failures[0][1]["rows_in"] > 10  # not in the first chunk: the rows before it were written


# -- line numbers in later chunks -----------------------------------------------------------------------
def test_line_numbers_exact_in_a_later_chunk(tmp_path: Path) -> None:
    lines = [orjson.dumps(chat_row(f"q{i}", f"a long enough answer {i}")) + b"\n" for i in range(300)]
    lines[10] = b"\n\n"  # blank lines count as lines
    lines[250] = b"{broken\n"
    lines[275] = orjson.dumps({"messages": [{"role": "user", "content": "only a question"}]}) + b"\n"
    src = tmp_path / "lines.jsonl"
    src.write_bytes(b"".join(lines))
    chunk = 1024
    assert len(b"".join(lines[:250])) > 3 * chunk  # the broken row is several chunks in
    _, two = convert_both(tmp_path, [src], chunk_bytes=chunk)
    assert [e.line for e in two.examples["json_error"]] == [252]  # 250 rows before + one extra blank line
    assert [e.line for e in two.examples["no_assistant_turn"]] == [277]
    assert two.extra["parallel"]["chunks"] > 5
    # and the line really is that one
    assert src.read_bytes().split(b"\n")[251] == b"{broken"


def test_jsonl_content_under_a_json_name(tmp_path: Path) -> None:
    """A .json file whose first line is a whole object is JSONL (the reader sniffs it): chunked too."""
    rows = [orjson.dumps(chat_row(f"q{i}", f"answer number {i} is long enough")) + b"\n" for i in range(200)]
    rows[120] = b"{bad\n"
    src = tmp_path / "lines.json"
    src.write_bytes(b"\xef\xbb\xbf" + b"".join(rows))
    one, two = convert_both(tmp_path, [src], chunk_bytes=1500)
    assert two.extra["parallel"]["chunks"] > 3
    assert [e.line for e in one.examples["json_error"]] == [121]


def test_forced_shape_same_bytes_and_report(tmp_path: Path) -> None:
    # plain OpenAI rows take the workers' fast path unless a shape is forced: then every row is checked
    src = tmp_path / "forced.jsonl"
    plain = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "x" * 40}]}
        for i in range(60)
    ]
    pairs = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a long enough answer"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in plain + [{"conversations": pairs}] * 2))
    one, _ = convert_both(tmp_path, [src], "openai", chunk_bytes=1024, from_format="sharegpt")
    assert one.rejected == {"format_mismatch": 60}
    assert one.rows_out == 2 and one.formats == {"sharegpt": 2}
