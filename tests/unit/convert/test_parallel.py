"""draftdeck.convert with worker processes: the same bytes and the same report as one process.

Every comparison runs both paths on the same input: ``workers=1`` (all in this process) and
``workers=2`` with small ranges, so that files are cut into many chunks and rows cross chunk edges.
(test_fast_path.py compares ``workers=1`` with read_conversations + Writer, the general path.)
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdeck.convert import ConvertOptions, convert
from draftdeck.errors import JobFailed
from draftdeck.formats.readers import JsonlRange, RowReader, jsonl_chunks
from draftdeck.issue_codes import Action
from draftdeck.quality import Policy, Report, Rule
from tests.conftest import FIXTURES as TEST_FIXTURES
from tests.conftest import real_file
from tests.support.convert import general_row

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


def _comparable(report: Report) -> dict[str, Any]:
    d = report.to_dict()
    d.pop("elapsed_s", None)
    d.pop("parallel", None)
    d["outputs"] = [{k: v for k, v in o.items() if k != "path"} for o in d["outputs"]]
    return d


def _both(
    tmp_path: Path, paths: list[Path], to: str = "sharegpt", chunk_bytes: int = 2048, **opts: Any
) -> tuple[Report, Report]:
    """Convert with 1 and 2 workers; assert the same output bytes and reports; return both reports."""
    one = convert(paths, tmp_path / f"w1-{to}.jsonl", to, options=ConvertOptions(workers=1, **opts))
    two = convert(
        paths,
        tmp_path / f"w2-{to}.jsonl",
        to,
        options=ConvertOptions(workers=2, chunk_bytes=chunk_bytes, **opts),
    )
    assert (tmp_path / f"w1-{to}.jsonl").read_bytes() == (tmp_path / f"w2-{to}.jsonl").read_bytes()
    assert _comparable(one) == _comparable(two)
    assert "parallel" not in one.extra
    return one, two


def _chat(user: str, answer: str, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
        **extra,
    }


def _mixed_rows(rng: random.Random, n: int) -> list[bytes]:
    """Lines of every kind the converter treats differently, duplicates and placeholders included."""
    texts = [
        "plain text",
        "café — naïve “quoted”",
        "中文文本 日本語 한국어",
        "emoji 🚀🚀",
        'code "x\\n" \\ y',
    ]
    lines: list[bytes] = []
    for i in range(n):
        t = f"{rng.choice(texts)} {i}"
        r = rng.random()
        if r < 0.3:
            row: Any = _chat(t, f"answer {t} " * rng.randint(1, 4))
        elif r < 0.45:
            row = {
                "id": f"sg{i}",
                "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": t * 3}],
            }
        elif r < 0.52:
            row = _chat(f"dup question {i % 5}", "the same long answer every time, long enough")  # duplicates
        elif r < 0.6:
            row = _chat(t, rng.choice(["OK.", "ok", "Sure!"]))  # placeholder candidates
        elif r < 0.64:
            row = {"instruction": t, "input": "", "output": "an alpaca answer " * 2}
        elif r < 0.67:
            row = {"prompt": {"text": t, "role": "prompter", "replies": [
                {"text": "first reply", "role": "assistant", "rank": 0},
                {"text": "second reply", "role": "assistant", "rank": 1},
            ]}}  # fmt: skip
        elif r < 0.7:
            row = _chat(t, f"kept {t} long answer", conversations="a kept field the sharegpt target reserves")
        elif r < 0.73:
            row = {"messages": [{"role": "user", "content": t}, {"role": "user", "content": "again"}]}
        elif r < 0.75:
            row = {"messages": [{"role": "assistant", "content": t}]}  # no user turn: rejected
        elif r < 0.77:
            row = {"messages": [
                {"role": "user", "content": t},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]},
                {"role": "tool", "tool_call_id": f"c{i}", "content": "result"},
                {"role": "assistant", "content": "done " + t},
            ]}  # fmt: skip
        elif r < 0.79:
            row = {"question": t}  # prompt-only: rejected unless allowed
        elif r < 0.81:
            row = {"unknown": t}
        elif r < 0.83:
            row = [1, 2]  # not an object
        elif r < 0.85:
            lines.append(b"{not json " + t.encode() + b"\n")
            continue
        elif r < 0.86:
            lines.append(b'{"messages": "\xff\xfe broken bytes"}\n')
            continue
        elif r < 0.9:
            lines.append(b"\n" if rng.random() < 0.5 else b"   \r\n")
            continue
        else:
            row = _chat(t, "<think>some reasoning</think>the answer " + t)
        lines.append(orjson.dumps(row) + (b"\r\n" if rng.random() < 0.05 else b"\n"))
    return lines


def _mixed_file(path: Path, n: int = 1500, seed: int = 3, tail: bytes = b"") -> Path:
    rng = random.Random(seed)
    path.write_bytes(b"\xef\xbb\xbf" + b"".join(_mixed_rows(rng, n)) + tail)
    return path


# -- equality on real files and generated files --------------------------------------------------------
@pytest.mark.parametrize("to", ["sharegpt", "openai"])
def test_real_files_same_bytes_and_report(tmp_path: Path, to: str) -> None:
    paths = [real_file(n) for n in REAL_JSONL] + [real_file(n) for n in REAL_JSON]
    one, two = _both(tmp_path, paths, to, chunk_bytes=4096)
    assert one.rows_in > 300
    assert two.extra["parallel"]["chunks"] > 20  # the JSONL files really went through the workers


def test_real_files_one_at_a_time_with_tiny_chunks(tmp_path: Path) -> None:
    for name in REAL_JSONL:
        one, _ = _both(tmp_path, [real_file(name)], chunk_bytes=700, allow_prompt_only=True)
        one.check_accounting()


def test_own_fixtures_same_bytes_and_report(tmp_path: Path) -> None:
    paths = sorted(p for p in FIXTURES.iterdir() if p.name != "unknown_keys.jsonl")
    one, two = _both(tmp_path, paths, "openai", chunk_bytes=256, allow_prompt_only=True)
    assert one.rows_in == 54
    assert (one.rejected["multimodal_content"], one.rejected["image_missing"]) == (1, 2)
    assert two.extra["parallel"]["chunks"] >= 3


def test_vendor_fixtures_same_bytes_and_report(tmp_path: Path) -> None:
    """Anthropic, Gemini, glaive, Hermes, preference rows and training flags: the workers read them
    as the parent does (the general path: none is a plain row)."""
    vendors = FIXTURES.parent / "vendors"
    paths = sorted(vendors.iterdir())
    for to in ("openai", "sharegpt"):
        one, two = _both(tmp_path, paths, to, chunk_bytes=512)
        assert one.rows_in == 35 and one.formats["anthropic"] == 4
        assert two.extra["parallel"]["chunks"] >= 8


def test_generated_mixed_file(tmp_path: Path) -> None:
    src = _mixed_file(tmp_path / "mixed.jsonl", tail=b'{"messages": [{"role": "user"')  # truncated last line
    one, two = _both(
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
    rows = b"".join(orjson.dumps(_chat(f"question {i}", f"answer {i} " * 4)) + b"\n" for i in range(30))
    src.write_bytes(rows + b'{"messages": [{"role": "user"')
    one, two = _both(tmp_path, [src], chunk_bytes=512)
    assert two.extra["parallel"]["chunks"] > 2
    assert one.rows_out == 30 and one.rejected["json_error"] == 1
    (example,) = one.examples["json_error"]
    assert example.line == 31
    assert example.reason.endswith("(the last line is truncated)"), example.reason


def test_generated_mixed_file_other_options(tmp_path: Path) -> None:
    src = _mixed_file(tmp_path / "mixed.jsonl", n=800, seed=11)
    policy = Policy(rules={"duplicate_conversation": Rule(Action.REJECT), "empty_turn": Rule(Action.REJECT)})
    _both(tmp_path, [src], "openai", chunk_bytes=1500, allow_prompt_only=True, policy=policy)
    _both(tmp_path, [src], "sharegpt", chunk_bytes=5000, check_duplicates=False, tree_paths="best")


@pytest.mark.parametrize("mode", ["strip", "keep"])
def test_placeholder_modes_same_bytes_and_report(tmp_path: Path, mode: str) -> None:
    src = _mixed_file(tmp_path / "mixed.jsonl", n=1500, seed=3)
    for to in ("sharegpt", "openai"):
        one, _ = _both(tmp_path, [src], to, chunk_bytes=2500, placeholders=mode, placeholder_buffer=8)
        code = "placeholder_stripped" if mode == "strip" else "placeholder_response"
        assert one.warnings[code] > 10 and not one.rejected["placeholder_response"]


def test_several_inputs_share_duplicates_and_placeholders(tmp_path: Path) -> None:
    a = _mixed_file(tmp_path / "a.jsonl", n=400, seed=1)
    b = _mixed_file(tmp_path / "b.jsonl", n=400, seed=1)  # the same rows again: all duplicates
    small = tmp_path / "small.jsonl"  # below one chunk: read in the parent, between two parallel files
    small.write_bytes(
        orjson.dumps(_chat("dup question 1", "the same long answer every time, long enough")) + b"\n"
    )
    one, _ = _both(tmp_path, [a, small, b], chunk_bytes=2000, placeholder_min_rows=3)
    assert one.warnings["duplicate_conversation"] > 200


def test_a_duplicate_names_the_record_it_repeats(tmp_path: Path) -> None:
    rows = b"".join(
        orjson.dumps(_chat(f"question {i}", f"a long enough answer {i}")) + b"\n" for i in range(300)
    )
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(rows + rows[: rows.index(b"\n") + 1])  # line 301 repeats line 1
    b.write_bytes(rows)  # every row repeats a's
    one, _ = _both(tmp_path, [a, b], chunk_bytes=2000)
    reasons = {(e.file, e.line): e.reason for e in one.examples["duplicate_conversation"]}
    assert reasons[(str(a), 301)] == "the same messages appeared earlier, at line 1"
    assert reasons[(str(b), 1)] == f"the same messages appeared earlier, at {a}:1"


@pytest.mark.parametrize("code", ["invalid_tool_arguments", "duplicate_conversation", "json_error"])
def test_policy_failure_at_the_same_row(tmp_path: Path, code: str) -> None:
    """A fail code stops both paths at the same row, with the same report (rows held for the
    placeholder check written, so that it balances) and no output file."""
    src = _mixed_file(tmp_path / "mixed.jsonl", n=600, seed=5)
    policy = Policy(rules={code: Rule(Action.FAIL)})
    failures = []
    for workers in (1, 2):
        opts = ConvertOptions(workers=workers, chunk_bytes=500, policy=policy, placeholder_min_rows=50)
        with pytest.raises(JobFailed) as exc:
            convert([src], tmp_path / f"f{workers}.jsonl", "sharegpt", options=opts)
        assert not (tmp_path / f"f{workers}.jsonl").exists()
        assert isinstance(exc.value.report, Report)
        exc.value.report.check_accounting()
        failures.append((str(exc.value), _comparable(exc.value.report)))
    assert failures[0] == failures[1]
    assert f"{code} at " in failures[0][0]
    assert failures[0][1]["rows_in"] > 10  # not in the first chunk: the rows before it were written


# -- line numbers, chunk edges -------------------------------------------------------------------------
def test_line_numbers_exact_in_a_later_chunk(tmp_path: Path) -> None:
    lines = [orjson.dumps(_chat(f"q{i}", f"a long enough answer {i}")) + b"\n" for i in range(300)]
    lines[10] = b"\n\n"  # blank lines count as lines
    lines[250] = b"{broken\n"
    lines[275] = orjson.dumps({"messages": [{"role": "user", "content": "only a question"}]}) + b"\n"
    src = tmp_path / "lines.jsonl"
    src.write_bytes(b"".join(lines))
    chunk = 1024
    assert len(b"".join(lines[:250])) > 3 * chunk  # the broken row is several chunks in
    _, two = _both(tmp_path, [src], chunk_bytes=chunk)
    assert [e.line for e in two.examples["json_error"]] == [252]  # 250 rows before + one extra blank line
    assert [e.line for e in two.examples["no_assistant_turn"]] == [277]
    assert two.extra["parallel"]["chunks"] > 5
    # and the line really is that one
    assert src.read_bytes().split(b"\n")[251] == b"{broken"


def test_chunks_cover_the_file_and_end_at_newlines(tmp_path: Path) -> None:
    src = _mixed_file(tmp_path / "m.jsonl", n=300, seed=2, tail=b'{"no final newline": 1}')
    data = src.read_bytes()
    for size in (1, 7, 100, 1000, len(data) - 1, len(data), len(data) + 5):
        chunks = list(jsonl_chunks(src, size))
        assert chunks[0][0] == 0 and chunks[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
        assert all(data[e - 1 : e] == b"\n" for _, e in chunks[:-1])
        for s, e in chunks:  # every range is whole UTF-8 (but for the deliberately broken bytes)
            assert data[s:e].replace(b"\xff\xfe", b"").decode("utf-8")


def test_cut_inside_a_multibyte_character(tmp_path: Path) -> None:
    first = orjson.dumps(_chat("€€€€ 中文 " * 20, "an answer with 🚀 and café " * 10)) + b"\n"
    rest = [orjson.dumps(_chat(f"中文 {i}", f"日本語の答え {i} 🚀")) + b"\n" for i in range(40)]
    src = tmp_path / "utf8.jsonl"
    src.write_bytes(first + b"".join(rest))
    at = first.index("🚀".encode()) + 2  # the target cut falls inside the 4-byte emoji
    assert first[at - 1] >= 0x80 and first[at] >= 0x80
    chunks = list(jsonl_chunks(src, at))
    assert chunks[0] == (0, len(first))
    _both(tmp_path, [src], chunk_bytes=at)


def test_cut_right_at_a_newline(tmp_path: Path) -> None:
    rows = [orjson.dumps(_chat(f"q{i}", f"answer number {i} is long")) + b"\n" for i in range(30)]
    src = tmp_path / "n.jsonl"
    src.write_bytes(b"".join(rows))
    size = len(rows[0])  # the target cut's last byte is the first row's newline
    chunks = list(jsonl_chunks(src, size))
    assert chunks[0] == (0, size)
    assert chunks[1][0] == size
    _both(tmp_path, [src], chunk_bytes=size)


def test_empty_chunks_of_blank_lines(tmp_path: Path) -> None:
    rows = [orjson.dumps(_chat(f"q{i}", f"answer number {i} is long")) + b"\n" for i in range(20)]
    src = tmp_path / "blank.jsonl"
    src.write_bytes(b"".join(rows[:10]) + b"\n" * 5000 + b"".join(rows[10:]) + b"\n" * 3000)
    chunks = list(jsonl_chunks(src, 1000))
    empty = [c for c in chunks if not src.read_bytes()[c[0] : c[1]].strip()]
    assert len(empty) >= 3
    s, e = empty[0]
    r = JsonlRange(src, s, e, 1)
    assert list(r) == [] and r.newlines == e - s
    one, two = _both(tmp_path, [src], chunk_bytes=1000)
    assert one.rows_in == 20
    assert two.extra["parallel"]["chunks"] == len(chunks)


def test_range_reader_matches_the_whole_file_reader(tmp_path: Path) -> None:
    src = _mixed_file(tmp_path / "m.jsonl", n=400, seed=9, tail=b"{truncated")
    with RowReader(src) as reader:
        whole = [(r.line, r.value, r.error, r.reason) for r in reader]
    parts: list[tuple[Any, ...]] = []
    first = 1
    for s, e in jsonl_chunks(src, 777):
        rng = JsonlRange(src, s, e, first)
        parts.extend((r.line, r.value, r.error, r.reason) for r in rng)
        first += rng.newlines
    assert parts == whole


def test_long_and_oversize_rows_across_chunks(tmp_path: Path) -> None:
    big = orjson.dumps(_chat("big", "x" * 50_000)) + b"\n"
    huge = orjson.dumps(_chat("huge", "y" * 200_000)) + b"\n"
    rows = [orjson.dumps(_chat(f"q{i}", f"answer number {i} is long")) + b"\n" for i in range(30)]
    src = tmp_path / "long.jsonl"
    src.write_bytes(b"".join(rows[:10]) + big + b"".join(rows[10:20]) + huge + b"".join(rows[20:]))
    one, two = _both(tmp_path, [src], chunk_bytes=4096, max_row_bytes=100_000)
    assert one.rejected["oversize_row"] == 1
    assert [e.line for e in two.examples["oversize_row"]] == [22]


def test_small_and_non_jsonl_inputs_stay_in_the_parent(tmp_path: Path) -> None:
    src = _mixed_file(tmp_path / "m.jsonl", n=50, seed=4)
    _, two = _both(tmp_path, [src, FIXTURES / "sharegpt.json"], chunk_bytes=10 << 20)
    assert two.extra["parallel"]["chunks"] == 0


def test_parquet_target_uses_one_process(tmp_path: Path) -> None:
    src = _mixed_file(tmp_path / "m.jsonl", n=100, seed=4)
    report = convert(
        [src], tmp_path / "o.parquet", "parquet", options=ConvertOptions(workers=2, chunk_bytes=500)
    )
    assert "parallel" not in report.extra
    assert report.rows_out > 0


def test_cli_workers_option(dd_home: Path) -> None:
    import json

    from typer.testing import CliRunner

    from draftdeck.cli import app

    data = dd_home / "data"
    src = data / "big.jsonl"
    rows = _mixed_rows(random.Random(8), 2000)
    with open(src, "wb") as f:
        for i in range(16):  # > 4 MiB (one chunk) so that the pool is used; repeated rows are duplicates
            f.write(b"".join(rows) + f'{{"question": "{i}"}}\n'.encode())
    assert src.stat().st_size > 4 << 20
    reports = []
    for workers in ("1", "2"):
        out, rep = data / f"o{workers}.jsonl", data / f"r{workers}.json"
        args = ["convert", str(src), "--to", "sharegpt", "--out", str(out), "--report", str(rep)]
        result = CliRunner().invoke(app, [*args, "--workers", workers])
        assert result.exit_code == 0, result.output
        d = json.loads(rep.read_text())
        assert d.pop("parallel", None) == ({"workers": 2, "chunks": 2} if workers == "2" else None)
        d.pop("elapsed_s")
        d["outputs"] = [{k: v for k, v in o.items() if k != "path"} for o in d["outputs"]]
        reports.append(d)
    assert reports[0] == reports[1]
    assert (data / "o1.jsonl").read_bytes() == (data / "o2.jsonl").read_bytes()
    assert (
        CliRunner()
        .invoke(app, ["convert", str(src), "--to", "openai", "--out", "x", "--workers", "0"])
        .exit_code
        == 2
    )


def test_a_failing_worker_is_an_error_not_a_hang(tmp_path: Path) -> None:
    from draftdeck.convert.workers import WorkerError, Workers

    src = _mixed_file(tmp_path / "m.jsonl", n=50, seed=4)
    workers = Workers(ConvertOptions(workers=2), "openai")
    try:
        workers.send((str(src), "m.jsonl", 0, src.stat().st_size, 1))  # from line 1
        workers.send((str(tmp_path / "gone.jsonl"), "gone.jsonl", 0, 10, 1))
        assert workers.receive().kinds  # the first worker converted its range
        with pytest.raises(WorkerError, match="FileNotFoundError"):
            workers.receive()
    finally:
        workers.close()
    assert not any(p.is_alive() for p in workers.procs)


def test_writer_thread_error_leaves_no_file(tmp_path: Path) -> None:
    """The writer hashes and writes on its own thread: an error in the block still leaves nothing."""
    from draftdeck.formats.writers import Writer

    out = tmp_path / "o.jsonl"
    line = orjson.dumps({"conversations": [{"from": "human", "value": "x" * 1000}]}) + b"\n"
    with pytest.raises(RuntimeError), Writer(out, "sharegpt") as w:
        for _ in range(5000):  # ~5 MB: several blocks in flight on the thread
            w.write_line(line)
        raise RuntimeError("stop")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert w._thread is None
    with Writer(out, "sharegpt") as w:
        for _ in range(5000):
            w.write_line(line)
    assert out.read_bytes() == line * 5000
    assert w.output is not None and w.output.bytes == len(line) * 5000
    import hashlib

    assert w.output.sha256 == hashlib.sha256(line * 5000).hexdigest()


# -- the fast path for plain rows --------------------------------------------------------------------------
_ROLES = st.sampled_from(
    ["user", "assistant", "system", "developer", "tool", "gpt", "human", "bot", "function_call"]
)
_TEXTS = st.sampled_from(
    ["", "  ", "hi", " padded answer that is long enough to not be a placeholder candidate ", "OK.",
     "<think>r</think>a long enough answer after the reasoning block, really long", "x" * 120,
     "<tool_call>{}</tool_call> and a long enough tail for the placeholder rule", "中文 " * 40, 7]
)  # fmt: skip


@st.composite
def _plain_ish(draw: st.DrawFn) -> Any:
    """A valid plain conversation (OpenAI or ShareGPT), then up to three perturbations of any kind."""
    sharegpt = draw(st.booleans())
    rk, tk = ("from", "value") if sharegpt else ("role", "content")
    user, gpt = ("human", "gpt") if sharegpt else ("user", "assistant")
    turns: list[dict[str, Any]] = [{rk: "system", tk: "be brief"}] if draw(st.booleans()) else []
    for i in range(draw(st.integers(1, 3))):
        turns += [{rk: user, tk: f"question {i}"}, {rk: gpt, tk: f"an answer long enough, number {i}"}]
    row: dict[str, Any] = {"conversations" if sharegpt else "messages": turns}
    for _ in range(draw(st.integers(0, 3))):
        what = draw(st.integers(0, 4))
        at = draw(st.integers(0, len(turns) - 1))
        if what == 0:
            turns[at][rk] = draw(_ROLES)
        elif what == 1:
            turns[at][tk] = draw(_TEXTS)
        elif what == 2:
            turns[at]["name"] = "n"
        elif what == 3:
            del turns[at]
            if not turns:
                break
        else:
            key = draw(st.sampled_from(["id", "system", "tools", "conversations", "messages", "x"]))
            row[key] = draw(st.sampled_from(["", "s", None, "[]", 3]))
    return row


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=_plain_ish(), to=st.sampled_from(["sharegpt", "openai"]))
def test_plain_row_fast_path_is_the_general_path(row: Any, to: str) -> None:
    from draftdeck.convert.fast import plain_row

    fast = plain_row(row, to, 24, True)
    if fast is not None:  # whenever the fast path answers, it answers what the general path does
        assert fast == general_row(row, to)


def test_plain_row_fast_path_takes_the_usual_rows() -> None:
    from draftdeck.convert.fast import plain_row

    answer = "a long enough answer " * 3
    for row in (
        _chat("q", answer, id=3),
        {"system": "s", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": answer}]},
        {"messages": [{"role": "developer", "content": "d"}, *_chat(" q ", answer)["messages"]]},
    ):
        for to in ("sharegpt", "openai"):
            fast = plain_row(row, to, 24, True)
            assert fast is not None and fast == general_row(row, to)
    assert plain_row(_chat("q", "OK."), "sharegpt", 24, True) is None  # a placeholder candidate


def test_cancel_mid_run_stops_workers_and_leaves_no_file(tmp_path: Path) -> None:
    import multiprocessing

    from draftdeck.errors import Cancelled

    src = _mixed_file(tmp_path / "m.jsonl", n=1500, seed=6)
    seen: list[int] = []

    def progress(done: int, total: int | None = None, unit: str = "rows") -> None:
        seen.append(done)
        if len(seen) == 3:
            raise Cancelled("stop")

    out = tmp_path / "o.jsonl"
    with pytest.raises(Cancelled):
        convert(
            [src], out, "sharegpt", options=ConvertOptions(workers=2, chunk_bytes=2000), progress=progress
        )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]
    assert multiprocessing.active_children() == []
    assert seen == sorted(seen) and seen[-1] < src.stat().st_size


def test_jsonl_content_under_a_json_name(tmp_path: Path) -> None:
    """A .json file whose first line is a whole object is JSONL (the reader sniffs it): chunked too."""
    rows = [orjson.dumps(_chat(f"q{i}", f"answer number {i} is long enough")) + b"\n" for i in range(200)]
    rows[120] = b"{bad\n"
    src = tmp_path / "lines.json"
    src.write_bytes(b"\xef\xbb\xbf" + b"".join(rows))
    one, two = _both(tmp_path, [src], chunk_bytes=1500)
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
    one, _ = _both(tmp_path, [src], "openai", chunk_bytes=1024, from_format="sharegpt")
    assert one.rejected == {"format_mismatch": 60}
    assert one.rows_out == 2 and one.formats == {"sharegpt": 2}
