# ruff: noqa: F811 - pytest fixtures imported from tests.support.tokenize
"""Agent traces and RLHF pairs: coding-agent session logs, agent event streams, tool-search answer
files, Human:/Assistant: prompt pairs, message lists that mix key conventions, legacy functions.

The fixtures in tests/fixtures/agents are hand-made from each shape's public conventions (odd cases
included: a streamed answer over three lines, a summary line first, a system note inside the chain,
a retried answer, a sidechain, a log whose lines name no parent; two calls in one model response,
state-change events, an error observation; prefixes of an episode). Every test reads them through
convert and checks that every input line or event is accounted for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draftdeck.convert import ConvertOptions, convert
from draftdeck.formats import agent_session
from draftdeck.formats.model import Conversation, SourceRef
from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.conftest import FIXTURES, NO_SHARED, REAL_DATA
from tests.support.tokenize import qwen_dir, qwen_tok, trained_runs, untrained_text  # noqa: F401
from tests.unit.formats.reading import read_file

AGENTS = FIXTURES / "agents"


def _source(conv: Conversation) -> SourceRef:
    """Where `conv` came from: every conversation read from a file has it."""
    assert conv.source is not None
    return conv.source


def _line(conv: Conversation) -> int:
    """`conv`'s source line: every one read from a JSONL file has it."""
    line = _source(conv).line
    assert line is not None
    return line


def _shape(conv: Conversation) -> list[tuple[Any, ...]]:
    return [
        (m.role, m.content, m.reasoning, [(c.name, c.arguments, c.id) for c in m.tool_calls],
         m.tool_call_id, m.is_error)
        for m in conv.messages
    ]  # fmt: skip


def test_a_session_log_is_its_conversations_with_every_line_counted() -> None:
    [main, side], report = read_file(AGENTS / "session.jsonl")
    # 18 lines: 2 conversations, 12 lines merged into them, 1 retried answer, 3 metadata lines
    assert (report.rows_in, dict(report.formats)) == (18, {"agent_session": 2})
    assert dict(report.rejected) == {"merged_event": 12, "abandoned_branch": 1, "session_metadata": 3}
    assert report.rows_lost == 1  # only the abandoned answer is data left out; the rest is folded in
    assert report.examples["merged_event"][0].reason == "merged into the session conversation at line 2"
    assert report.examples["abandoned_branch"][0].line == 13
    assert [e.line for e in report.examples["session_metadata"]] == [1, 7, 10]
    edit = {"file_path": "/home/dev/shop/cart.py", "old_string": "def total",
            "new_string": "from decimal import Decimal\n\n\ndef total"}  # fmt: skip
    assert _shape(main)[0][0] == "user"
    assert _shape(main)[1] == (  # three streamed lines of one answer: one turn, blocks in order
        "assistant", "Let me read the cart code.", "Floating point sums. Look at cart.py first.",
        [("Read", {"file_path": "/home/dev/shop/cart.py"}, "toolu_01")], None, False)  # fmt: skip
    assert [(m.role, m.tool_call_id, m.is_error) for m in main.messages[2:5]] == [
        ("tool", "toolu_01", False), ("assistant", None, False), ("tool", "toolu_02", True)]  # fmt: skip
    # the system note between the error and the next answer does not break the chain
    assert _shape(main)[5][1:4] == (
        "Decimal needs importing first; adding it.",
        None,
        [("Edit", edit, "toolu_03")],
    )
    assert main.messages[-1].content.startswith("Fixed: the total now sums Decimal")  # not the retried one
    assert "Done, probably." not in [m.content for m in main.messages]
    assert main.meta == {"session_id": "s-1", "cwd": "/home/dev/shop", "git_branch": "main",
                         "model": "claude-sonnet-4-5"}  # fmt: skip
    assert [m.role for m in side.messages] == ["user", "assistant", "tool", "assistant"]
    assert side.meta["sidechain"] is True and _source(side).line == 15


def test_a_session_log_without_parent_links_is_one_conversation_in_file_order(tmp_path: Path) -> None:
    """Issue 49: a Claude Code log whose every line has ``parentUuid: null`` (one session, a summary
    naming its last message) was 6 one-line conversations, none kept. Its lines are one conversation
    in file order, with both calls and both results, and every line is accounted for."""
    path = AGENTS / "session_no_parents.jsonl"
    [conv], report = read_file(path)
    assert (report.rows_in, report.rows_out, dict(report.formats)) == (7, 1, {"agent_session": 1})
    assert dict(report.rejected) == {"merged_event": 5, "session_metadata": 1} and report.rows_lost == 0
    grep = {"pattern": "TODO", "path": "notes.md", "output_mode": "count"}
    assert [(s[0], s[3], s[4]) for s in _shape(conv)] == [
        ("user", [], None),
        ("assistant", [("Grep", grep, "toolu_a1")], None),
        ("tool", [], "toolu_a1"),
        ("assistant", [("Read", {"file_path": "/home/dev/notes/notes.md"}, "toolu_a2")], None),
        ("tool", [], "toolu_a2"),
        ("assistant", [], None),
    ]
    assert conv.messages[-1].content == "Three TODO markers are left: buy milk, call Sam and fix bike."
    out = tmp_path / "o.jsonl"
    written = convert([path], out, "openai")
    written.check_accounting()
    assert written.rows_out == 1 and len(out.read_text().splitlines()) == 1
    # the summary's leaf ends a conversation: an exchange after it in the same session is the next one
    lines = path.read_text().splitlines()
    more = [json.loads(line) for line in lines[:2]]
    more[0].update(uuid="d1", message={"role": "user", "content": "And how many are done?"})
    more[1].update(uuid="d2", message={"id": "msg_b1", "role": "assistant", "content": "One: taxes."})
    two = tmp_path / "two.jsonl"
    two.write_text("\n".join([*lines, *map(json.dumps, more)]) + "\n")
    [first, second], report = read_file(two)
    assert len(first.messages) == 6 and [m.content for m in second.messages] == [
        "And how many are done?", "One: taxes."]  # fmt: skip
    assert dict(report.rejected) == {"merged_event": 6, "session_metadata": 1}


def test_a_real_claude_code_log_keeps_its_conversations() -> None:
    """Any Claude Code session log among ../shared/datasets/real/: every line accounted for, a
    conversation kept, none of its lines lost as a turn without its other side."""
    if not REAL_DATA.exists():
        pytest.skip(f"{REAL_DATA} is absent: {NO_SHARED}")
    logs = [f for f in sorted(REAL_DATA.glob("*.jsonl")) if _first_is_session_line(f)]
    if not logs:
        pytest.skip(f"no Claude Code session log in {REAL_DATA} (the fixture above covers the shape)")
    for log in logs:
        convs, report = read_file(log)
        assert convs and report.formats["agent_session"] == len(convs), log.name
        assert not report.rejected.get("no_user_turn") and not report.rejected.get("no_assistant_turn")


def _first_is_session_line(path: Path) -> bool:
    with path.open("rb") as f:
        first = f.readline()
    try:
        return agent_session.is_line(json.loads(first))
    except ValueError:
        return False


def test_a_conversation_over_the_row_limit_is_rejected_whole_whatever_its_rows() -> None:
    """The row limit is on a conversation: a session (or an event stream) made of many small lines is
    held to it too; every line of one over it is rejected, and the other conversation is kept."""
    whole, _ = read_file(AGENTS / "session.jsonl")
    assert sorted(_line(c) for c in whole if c.source) == [2, 15]
    convs, report = read_file(AGENTS / "session.jsonl", max_row_bytes=3000)
    assert [c.source.line for c in convs if c.source] == [15]  # the sidechain fits, the main one does not
    # the main session's 11 lines (its abandoned branch too); the sidechain's 3 later lines merge as before
    assert dict(report.rejected) == {"oversize_row": 11, "merged_event": 3, "session_metadata": 3}
    why = report.examples["oversize_row"][0].reason
    assert why.startswith("part of the conversation at line 2: its ") and "exceed the limit of 3,000" in why
    [], stream = read_file(AGENTS / "events.json", max_row_bytes=500)
    assert stream.rejected["oversize_row"] == 9 and stream.rejected["session_metadata"] == 3


def test_an_event_stream_is_one_conversation_with_the_model_s_own_calls() -> None:
    [conv], report = read_file(AGENTS / "events.json")
    assert (report.rows_in, dict(report.formats)) == (12, {"event_stream": 1})
    assert dict(report.rejected) == {"merged_event": 8, "session_metadata": 3}
    shape = _shape(conv)
    assert [s[0] for s in shape] == ["system", "user", "assistant", "tool", "tool", "assistant", "tool",
                                     "assistant"]  # fmt: skip
    # two actions of one model response: one turn with both calls, as the model wrote it
    view = {"command": "view", "path": "/ws/test_cart.py"}
    assert shape[2] == (
        "assistant", "I will list the files and read the test first.",
        "Two independent looks: do both at once.",
        [("execute_bash", {"command": "ls"}, "call_1"), ("str_replace_editor", view, "call_2")],
        None, False)  # fmt: skip
    assert [(s[4], s[5]) for s in shape if s[0] == "tool"] == [
        ("call_1", False), ("call_2", False), ("call_3", True)]  # fmt: skip
    assert [t["function"]["name"] for t in conv.tools] == ["execute_bash", "str_replace_editor", "finish"]
    assert shape[-1][3] == [("finish", {"message": "Fixed the rounding."}, "call_4")]


def test_a_declared_mapping_reads_each_line_as_it_is() -> None:
    """A mapping overrides detection, the grouping of session lines included: each line is a row."""
    convs, report = read_file(AGENTS / "session.jsonl", columns={"prompt": "summary", "response": "leafUuid"})
    assert report.rows_in == 18 and len(convs) == 1  # only the summary line has the fields
    assert dict(report.rejected) == {"format_mismatch": 17}


def test_an_event_list_row_reads_the_same() -> None:
    events = json.loads((AGENTS / "events.json").read_text())
    from draftdeck.formats.common import ParseContext
    from draftdeck.formats.detect import parse

    family, [conv] = parse(events, ParseContext())  # a JSONL line that is the list of events
    [whole], _ = read_file(AGENTS / "events.json")
    assert family == "event_stream" and _shape(conv) == _shape(whole)


def test_older_and_trimmed_streams_read_the_same_calls(tmp_path: Path) -> None:
    """[action, observation] pairs (older histories, a file or a `history` row) read as the flat list;
    a response trimmed to its id gives one turn per response, its calls rebuilt from each action."""
    from draftdeck.formats.common import ParseContext
    from draftdeck.formats.detect import parse

    events = json.loads((AGENTS / "events.json").read_text())
    [whole], _ = read_file(AGENTS / "events.json")
    pairs = [events[i : i + 2] for i in range(0, len(events), 2)]
    (tmp_path / "pairs.json").write_text(json.dumps(pairs))
    [conv], report = read_file(tmp_path / "pairs.json")
    assert _shape(conv) == _shape(whole) and report.rows_in == 6
    assert dict(report.rejected) == {"merged_event": 4, "session_metadata": 1}  # events 2-3: metadata
    family, [row] = parse({"instance_id": "x-1", "history": pairs}, ParseContext())
    assert family == "event_stream" and _shape(row) == _shape(whole) and row.meta == {"instance_id": "x-1"}
    for e in events:
        meta = e.get("tool_call_metadata")
        if meta:
            meta["model_response"] = {"id": meta["model_response"]["id"]}
    _, [trimmed] = parse(events, ParseContext())
    calls = [
        [(c.name, c.arguments, c.id) for c in m.tool_calls] for m in trimmed.messages if m.role == "assistant"
    ]
    assert calls == [
        [
            ("execute_bash", {"command": "ls"}, "call_1"),
            ("str_replace_editor", {"path": "/ws/test_cart.py"}, "call_2"),
        ],
        [("execute_bash", {"command": "python -m pytest -q"}, "call_3")],
        [("finish", {"final_thought": "Fixed the rounding.", "outputs": {}}, "call_4")],
    ]
    assert trimmed.messages[2].content == "I will list the files and read the test first."  # the thought


def test_a_tool_search_file_trains_each_answer_once() -> None:
    [conv], report = read_file(AGENTS / "toolbench_dfs.json")
    assert dict(report.formats) == {"tool_search": 1}
    assert "2 of the 3 episodes" in report.examples["contained_prefix"][0].reason
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                              "assistant"]  # fmt: skip
    assert [c.name for m in conv.messages for c in m.tool_calls] == [
        "get_weather_for_weatherapi", "convert_for_units", "Finish"]  # fmt: skip
    assert conv.messages[3].name == "get_weather_for_weatherapi"
    assert [t["function"]["name"] for t in conv.tools] == ["get_weather_for_weatherapi", "convert_for_units",
                                                           "Finish"]  # fmt: skip
    assert conv.meta == {"query": "What is the weather in Paris, and convert 20 C to F?", "valid_data": True,
                         "win": True}  # fmt: skip


def test_distinct_branches_of_a_search_are_each_kept() -> None:
    from draftdeck.formats.common import ParseContext
    from draftdeck.formats.tool_search import parse_row

    u = {"role": "user", "content": "q"}
    a, b = {"role": "assistant", "content": "try A"}, {"role": "assistant", "content": "try B"}
    row = {"answer_generation": {"train_messages": [[u, a], [u, b], [u], [u, a]]}}
    ctx = ParseContext()
    convs = parse_row(row, ctx)
    assert [c.messages[-1].content for c in convs] == ["try A", "try B"]  # the repeat and the prefix left
    assert [_source(c).path for c in convs] == ["episode=0", "episode=1"]
    assert ctx.warnings["contained_prefix"].startswith("2 of the 4 episodes")
    from draftdeck.formats.common import RowRejected

    with pytest.raises(RowRejected, match="is empty \\(valid_data is false") as failed:
        parse_row({"answer_generation": {"valid_data": False, "train_messages": []}}, ParseContext())
    assert failed.value.code == "empty_conversation"


def test_rlhf_prompt_pairs_read_their_turns() -> None:
    convs, report = read_file(AGENTS / "rlhf_pairs.jsonl")
    convs.sort(key=_line)
    assert [[(m.role, m.content) for m in c.messages] for c in convs] == [
        [("user", "How do I boil an egg?"),
         ("assistant", "Put it in boiling water for 9 minutes, then cool it in cold water.")],
        [("user", "Name a prime number."), ("assistant", "7."), ("user", "And an even one?"),
         ("assistant", "2 is the only even prime.")],
        [("user", "Write one word for happy."), ("assistant", "Joyful.")],
        [("user", "What is the capital of Peru?"), ("assistant", "Lima is the capital of Peru."),
         ("user", "Its population?"), ("assistant", "About ten million people live in Lima.")],
        [("user", "Is 9 prime?"), ("assistant", "No."), ("user", "Why not?"),
         ("assistant", "It is 3 times 3.")],
    ]  # fmt: skip
    assert dict(report.formats) == {"preference": 4, "query_response": 1}
    assert dict(report.warnings) == {"preference_chosen": 4} and all(not c.meta for c in convs)
    assert "no rejected side" in [e.reason for e in report.examples["preference_chosen"]][2]


def test_mixed_key_conventions_and_legacy_functions(tmp_path: Path) -> None:
    convs, report = read_file(AGENTS / "mixed_keys.jsonl")
    convs.sort(key=_line)
    assert [[(m.role, m.content) for m in c.messages] for c in convs[:2]] == [
        [("user", "Say hello in French."), ("assistant", "Bonjour.")],
        [("user", "Say thanks in German."), ("assistant", "Danke.")],
    ]
    tokyo = convs[2]
    zone = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
    assert tokyo.tools == [{"type": "function", "function": {
        "name": "get_time", "description": "The current time in a zone", "parameters": zone}}]  # fmt: skip
    assert "functions" not in tokyo.meta and report.warnings.get("unrepresentable_field") is None
    out = tmp_path / "o.jsonl"
    convert([AGENTS / "mixed_keys.jsonl"], out, "openai")
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["tools"][0]["function"]["name"] for r in written if "tools" in r] == ["get_time"]


@pytest.mark.parametrize("to", ["openai", "sharegpt"])
def test_agent_shapes_convert_with_their_structure(to: str, tmp_path: Path) -> None:
    names = ["session.jsonl", "events.json", "toolbench_dfs.json"]
    for name in names:
        read, _ = read_file(AGENTS / name)
        out = tmp_path / f"{name}.{to}.jsonl"
        report = convert([AGENTS / name], out, to)
        report.check_accounting()
        again, _ = read_file(out)
        assert [_shape(c) for c in again] == [_shape(c) for c in read], (name, to)
        assert [c.tools for c in again] == [c.tools for c in read]


def test_a_large_session_log_converts_in_one_place_with_workers(tmp_path: Path) -> None:
    lines = (AGENTS / "session.jsonl").read_bytes()
    big = tmp_path / "big.jsonl"
    big.write_bytes(lines * 3)  # the same session thrice: its lines continue one chain per lane
    one, many = tmp_path / "one.jsonl", tmp_path / "many.jsonl"
    r1 = convert([big], one, "openai")
    r2 = convert([big], many, "openai", options=ConvertOptions(workers=2, chunk_bytes=4096))
    assert one.read_bytes() == many.read_bytes()
    assert r1.rows_in == r2.rows_in == 54 and r1.rejected == r2.rejected


def test_agent_shapes_tokenize_with_exact_masks(tmp_path: Path, qwen_dir: Path, qwen_tok: Any) -> None:
    """Tool calls and tool results rendered by the target's template; only the assistant's tokens
    trained (its text, reasoning and calls), the user's, the tools' and the system's in the context."""
    converted = []
    for name in ("session.jsonl", "events.json", "toolbench_dfs.json"):
        out = tmp_path / f"{name}.jsonl"
        convert([AGENTS / name], out, "openai")
        converted.append(out)
    report = tokenize_files(converted, tmp_path / "ds", TokenizeOptions(qwen_dir, workers=1, verify_all=True))
    assert report.rows_out == 4 and not report.rejected
    ds = ShardDataset(tmp_path / "ds")
    rows = [ds.row(i) for i in range(len(ds))]
    trained = "".join(t for r in rows for t in trained_runs(qwen_tok, r["input_ids"], r["loss_mask"]))
    context = "".join(untrained_text(qwen_tok, r["input_ids"], r["loss_mask"]) for r in rows)
    for answer in ("Let me read the cart code.", "Fixed: the total now sums Decimal prices",
                   "One call: checkout.py line 12.", "I will list the files and read the test first.",
                   "The tests pass now.", "Thought: now convert the temperature."):  # fmt: skip
        assert answer in trained, answer
    assert '<tool_call>\n{"name": "Read", "arguments": {"file_path": "/home/dev/shop/cart.py"}}' in trained
    assert '{"name": "execute_bash", "arguments": {"command": "ls"}}' in trained
    for said in ("The cart total is off by a cent", "Error: Decimal is not imported", "Make test_cart pass.",
                 "cart.py\ntest_cart.py", "You are a coding agent.", "\"response\": \"68 F\""):  # fmt: skip
        assert said in context and said not in trained, said
    assert "<tool_response>\nERROR: pytest timed out after 2 s\n</tool_response>" in context
    assert '"name": "str_replace_editor"' in context  # the stream's tools, rendered in the system turn
    assert "Done, probably." not in trained + context  # the abandoned retry is nowhere
