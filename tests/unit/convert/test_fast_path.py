"""The one-process convert of a JSONL target (the record path, its fast path for the usual rows) writes
the bytes and the report of the general path: read_conversations (detection, parser, checks) + Writer.

The reference is ``convert`` itself with its JSONL writing swapped for the read_conversations loop it
ran before the fast path existed, so everything else (policy, failures, report) is the same code.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdeck.convert import ConvertOptions, convert, read_conversations
from draftdeck.convert import run as convert_run
from draftdeck.errors import JobFailed
from draftdeck.issue_codes import Action
from draftdeck.quality import Policy, Report, Rule
from tests.conftest import FIXTURES, REAL_DATA
from tests.support.convert import general_row
from tests.support.convert_parallel import comparable, mixed_file


def _general(inputs: Any, writer: Any, report: Report, opts: ConvertOptions, to: str, progress: Any) -> None:
    for conv in read_conversations(inputs, report, opts, progress):
        writer.write(conv)
        report.rows_out += 1


def _outcome(paths: list[Path], out: Path, to: str, opts: dict[str, Any]) -> tuple[Any, ...]:
    """(output bytes or None, comparable report, failure message) of one convert."""
    out.unlink(missing_ok=True)
    try:
        report = convert(paths, out, to, options=ConvertOptions(**opts))
    except JobFailed as exc:
        assert not out.exists() and isinstance(exc.report, Report)
        return None, comparable(exc.report), str(exc)
    return out.read_bytes(), comparable(report), None


def _same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, paths: list[Path], to: str, **opts: Any
) -> tuple[Any, ...]:
    fast = _outcome(paths, tmp_path / f"fast.{to}.jsonl", to, opts)
    with monkeypatch.context() as m:
        m.setattr(convert_run, "write_converted", _general)
        general = _outcome(paths, tmp_path / f"general.{to}.jsonl", to, opts)
    assert fast[2] == general[2]
    assert fast[1] == general[1]
    assert fast[0] == general[0]  # byte for byte
    return fast


def _data_files() -> list[Path]:
    own = [
        p for p in sorted(FIXTURES.rglob("*")) if p.suffix in (".json", ".jsonl") and "configs" not in p.parts
    ]
    real = (
        sorted(p for p in REAL_DATA.glob("*") if p.suffix in (".json", ".jsonl"))
        if REAL_DATA.exists()
        else []
    )
    return own + real


OPTION_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "prompt_only": {"allow_prompt_only": True},
    "strip": {"placeholders": "strip", "placeholder_min_rows": 3, "placeholder_min_share": 0.0},
    "keep_no_duplicates": {"placeholders": "keep", "check_duplicates": False, "tree_paths": "best"},
}


@pytest.mark.parametrize("to", ["sharegpt", "openai"])
@pytest.mark.parametrize("option_set", sorted(OPTION_SETS))
def test_every_data_file_as_the_general_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str, option_set: str
) -> None:
    files = _data_files()
    for path in files:
        _same(tmp_path, monkeypatch, [path], to, **OPTION_SETS[option_set])
    _same(tmp_path, monkeypatch, files, to, **OPTION_SETS[option_set])  # duplicates across files too


def _bench_like(path: Path, n: int, seed: int) -> Path:
    """Rows of the benchmark's shapes (benchmarks/convert.py), with duplicates, edge whitespace, kept
    fields and a kept provenance mixed in."""
    rng = random.Random(seed)
    words = ["the", "answer", "is", "café", "中文", "emoji 🚀", "<b>", "x < y", "\\n", "tab\t"]
    tags = ["<think>", "<tool_call>", "<think>why</think>"]

    def text(lo: int, hi: int) -> str:
        said = " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))
        return said if rng.random() < 0.95 else rng.choice(tags) + said

    rows: list[Any] = []
    for i in range(n):
        r = rng.random()
        answer = text(20, 60) if rng.random() < 0.9 else rng.choice(["OK.", "Sure!"])
        if rng.random() < 0.1:
            answer = rng.choice([" ", "\n", ""]) + answer + rng.choice([" ", "\n\n", ""])
        if r < 0.35:
            msgs = [{"role": "system", "content": "You are helpful."}] if rng.random() < 0.4 else []
            msgs += [{"role": "user", "content": text(1, 9)}, {"role": "assistant", "content": answer}]
            row: dict[str, Any] = {"messages": msgs}
        elif r < 0.6:
            row = {"id": f"sg-{i}", "conversations": [
                {"from": "human", "value": text(1, 9)}, {"from": "gpt", "value": answer}]}  # fmt: skip
        elif r < 0.72:
            row = {"instruction": text(1, 9), "input": rng.choice(["", text(1, 5)]), "output": answer}
        elif r < 0.8:
            q, a = rng.choice([("query", "response"), ("question", "answer"), ("prompt", "completion")])
            row = {q: rng.choice([text(1, 9), "Human: hi\n\nAssistant:"]), a: answer}
        elif r < 0.85:
            row = {"instruction": text(1, 5), "context": text(0, 5), "response": answer, "category": "qa"}
        elif r < 0.9:
            row = rows[rng.randrange(len(rows))] if rows else {"messages": []}  # a duplicate...
            if "messages" in row and rng.random() < 0.5:  # ... padded, or with what the fast path leaves
                row = {**row, "messages": [*row["messages"], {"role": "user", "content": " again"}][:-1]}
                row["messages"][-1] = {**row["messages"][-1], "content": row["messages"][-1]["content"] + " "}
                if rng.random() < 0.5:
                    row["tools"] = []
        else:
            row = _chat(text(1, 9), answer)
            row["draftdeck_source"] = rng.choice(
                [{"file": "orig.jsonl", "row": i}, {"file": "m", "row": 1, "repeat": 2}, None, "bad"]
            )
            row["n"] = rng.choice([1, 2**70, "x" * 250])
        rows.append(row)
    path.write_bytes(b"".join(_line(r) for r in rows))
    return path


def _chat(user: str, answer: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def _line(row: Any) -> bytes:
    try:
        return orjson.dumps(row) + b"\n"
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return json.dumps(row).encode() + b"\n"


@pytest.mark.parametrize("to", ["sharegpt", "openai"])
def test_generated_rows_as_the_general_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str) -> None:
    src = _bench_like(tmp_path / "bench.jsonl", 1500, seed=11)
    for opts in OPTION_SETS.values():
        _same(tmp_path, monkeypatch, [src], to, **opts)
    mixed = mixed_file(tmp_path / "mixed.jsonl", n=2000, seed=5)
    for opts in OPTION_SETS.values():
        _same(tmp_path, monkeypatch, [mixed, src], to, **opts)


def test_a_policy_failure_as_the_general_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _bench_like(tmp_path / "bench.jsonl", 600, seed=4)
    policy = Policy(rules={"duplicate_conversation": Rule(Action.FAIL)})
    data, _, failure = _same(tmp_path, monkeypatch, [src], "sharegpt", policy=policy)
    assert data is None and failure and "duplicate_conversation" in failure


# -- the fast path alone, row by row -------------------------------------------------------------------
_TEXT = st.sampled_from(
    ["", " ", "q", " padded question ", "a long enough answer for the placeholder rule to let it pass",
     "OK.", "Human: hi\n\nAssistant:", "<think>r</think>a long enough answer after the reasoning, yes", 7,
     None, "x" * 250]
)  # fmt: skip
_KEYS = st.sampled_from(
    ["instruction", "input", "output", "context", "response", "query", "question", "answer", "prompt",
     "completion", "system", "history", "id", "chosen", "rejected", "messages", "conversations", "text",
     "contents", "chat", "replies", "events"]
)  # fmt: skip


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=st.dictionaries(_KEYS, _TEXT, min_size=1, max_size=5), to=st.sampled_from(["sharegpt", "openai"]))
def test_column_rows_fast_path_is_the_general_path(row: dict[str, Any], to: str) -> None:
    from draftdeck.convert.fast import plain_row

    fast = plain_row(row, to, 24, True, ("f.jsonl", 3))
    if fast is not None:
        assert fast == general_row(row, to, origin=("f.jsonl", 3))


def test_the_usual_column_rows_take_the_fast_path() -> None:
    from draftdeck.convert.fast import plain_row
    from draftdeck.formats.detect import detect

    answer = "a long enough answer " * 3
    for row in (
        {"instruction": "do it", "input": "", "output": answer},
        {"instruction": "do it", "input": "with this", "output": answer, "id": 4},
        {"instruction": "do it", "context": "ctx", "response": answer, "category": "open_qa"},
        {"query": "q", "response": answer},
        {"prompt": "p", "completion": answer},
        {"question": " q ", "answer": answer},
    ):
        for to in ("sharegpt", "openai"):
            fast = plain_row(row, to, 24, True, ("f.jsonl", 3))
            assert fast is not None and fast == general_row(row, to, origin=("f.jsonl", 3))
    assert plain_row({"query": "Human: hi\n\nAssistant:", "response": answer}, "sharegpt", 24, True) is None
    preference = {**_chat("q", answer), "chosen": "c", "rejected": "r"}  # the preference shape's
    assert plain_row(preference, "sharegpt", 24, True) is None
    assert detect(preference)[0] == "preference"


# -- rows with tool calls (draftdeck.convert.fast_tools) ----------------------------------------------
def _tool_chat(call_id: str = "call_1", arguments: str = '{"q": "weather", "n": 2}') -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "search", "arguments": arguments}}
    return {
        "messages": [
            {"role": "user", "content": "what is the weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"},
            {"role": "assistant", "content": "It is sunny, 21 degrees: a long enough answer."},
        ],
        "tools": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],
    }


_TOOL_TEXTS = st.sampled_from(
    ["", "  ", "x", " padded ", "<think>r</think>a", "<tool_call>{}", "<tool_response>r"]
)
_TOOL_VALUES: st.SearchStrategy[Any] = st.sampled_from(
    ["", "call_1", "call_2", None, 3, "{", "[]", "null", '{"a": 1e400}', [], {}]
)


@st.composite
def _tool_ish(draw: st.DrawFn) -> Any:
    """A valid OpenAI conversation with tool calls, then up to three perturbations of any kind."""
    row = _tool_chat()
    turns = row["messages"]
    if draw(st.booleans()):  # two calls answered in order, then another round
        turns[1]["tool_calls"].append(
            {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}}
        )
        turns.insert(3, {"role": "tool", "tool_call_id": "call_2", "content": "noon"})
        turns += [{"role": "user", "content": "thanks"}, {"role": "assistant", "content": "You are welcome."}]
    for _ in range(draw(st.integers(0, 3))):
        what = draw(st.integers(0, 6))
        at = draw(st.integers(0, len(turns) - 1))
        turn = turns[at]
        if what == 0:
            turn["role"] = draw(st.sampled_from(["user", "assistant", "tool", "system", "developer", "x"]))
        elif what == 1:
            turn["content"] = draw(st.one_of(_TOOL_TEXTS, _TOOL_VALUES))
        elif what == 2:
            turn[draw(st.sampled_from(["name", "tool_call_id", "tool_calls", "reasoning_content"]))] = draw(
                _TOOL_VALUES
            )
        elif what == 3:
            del turns[at]
            if not turns:
                break
        elif (
            what == 4 and "tool_calls" in turn and isinstance(turn["tool_calls"], list) and turn["tool_calls"]
        ):
            call = turn["tool_calls"][0]
            key = draw(st.sampled_from(["id", "type", "function", "index", "name", "arguments"]))
            if key in ("name", "arguments") and isinstance(call.get("function"), dict):
                call["function"][key] = draw(_TOOL_VALUES)
            else:
                call[key] = draw(_TOOL_VALUES)
        elif what == 5:
            key = draw(
                st.sampled_from(["id", "system", "tools", "functions", "conversations", "draftdeck_source"])
            )
            row[key] = draw(
                st.sampled_from(["", "s", None, "[]", 3, [{"name": "f", "input_schema": {}}], []])
            )
        else:
            turns.insert(at, dict(turns[draw(st.integers(0, len(turns) - 1))]))
    return row


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=_tool_ish(), to=st.sampled_from(["sharegpt", "openai"]))
def test_tool_rows_fast_path_is_the_general_path(row: Any, to: str) -> None:
    from draftdeck.convert.fast import plain_row

    fast = plain_row(row, to, 24, True, ("f.jsonl", 3))
    if fast is not None:  # whenever the fast path answers, it answers what the general path does
        assert fast == general_row(row, to, origin=("f.jsonl", 3))


def test_the_usual_tool_rows_take_the_fast_path() -> None:
    from draftdeck.convert.fast import plain_row

    no_tools = _tool_chat()
    del no_tools["tools"]
    for row in (
        _tool_chat(),
        {**_tool_chat(), "id": "r7"},
        no_tools,
        _tool_chat(arguments='{"q": "\\u00e9"}'),
    ):
        for to in ("sharegpt", "openai"):
            fast = plain_row(row, to, 24, True, ("f.jsonl", 3))
            assert fast is not None and fast == general_row(row, to, origin=("f.jsonl", 3))
    for broken in ("{", ""):  # arguments that are no JSON: invalid_tool_arguments, said by the general path
        assert plain_row(_tool_chat(arguments=broken), "sharegpt", 24, True) is None
    orphan = _tool_chat()
    orphan["messages"][2]["tool_call_id"] = "call_9"
    assert plain_row(orphan, "sharegpt", 24, True) is None
