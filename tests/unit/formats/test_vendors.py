# ruff: noqa: F811 - pytest fixtures imported from tokenize_helpers
"""Every vendor's format (Anthropic, Gemini, glaive, Hermes, preference sets, OpenAI with a top-level
system) read with its structure, nothing lost, and per-turn training flags honoured in the masks.

The fixtures in tests/fixtures/vendors are written from each format's public documentation,
odd cases included; every test reads them through convert (both JSONL targets) and tokenize with the
project's Qwen3.6-vocabulary tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draftdeck.convert import ConvertOptions, convert, read_conversations
from draftdeck.formats.model import Conversation
from draftdeck.quality import Report
from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.conftest import FIXTURES
from tests.support.tokenize import qwen_dir, qwen_tok, trained_runs, untrained_text  # noqa: F401

VENDORS = FIXTURES / "vendors"


def _read(name: str, **opts: Any) -> tuple[list[Conversation], Report]:
    report = Report()
    convs = list(read_conversations([VENDORS / name], report, ConvertOptions(**opts)))
    report.rows_out = len(convs)
    report.check_accounting()
    convs.sort(key=lambda c: c.origin() or ("", 0))  # short answers wait in the placeholder buffer
    return convs, report


def _shape(conv: Conversation) -> list[tuple[Any, ...]]:
    """What must survive: role, text, reasoning, tool calls (name, arguments, id), the call answered,
    the training flag."""
    return [
        (m.role, m.content, m.reasoning, [(c.name, c.arguments, c.id) for c in m.tool_calls],
         m.tool_call_id, m.train)
        for m in conv.messages
    ]  # fmt: skip


# name -> (rows in, rows kept, formats, rejected, warnings)
EXPECTED = {
    "anthropic.jsonl": (5, 3, {"anthropic": 4}, {"image_unreadable": 1, "lost_part": 1},
                        {"redacted_reasoning": 1}),
    "gemini.jsonl": (5, 3, {"gemini": 4}, {"image_unreadable": 1, "lost_part": 1}, {}),
    "glaive.jsonl": (3, 3, {"glaive": 3}, {}, {"invalid_tool_arguments": 1}),
    "hermes.jsonl": (3, 3, {"hermes": 3}, {}, {"tool_tags_unparsed": 1}),
    "preference.jsonl": (5, 5, {"preference": 5}, {}, {"preference_chosen": 5}),
    "openai_system.jsonl": (3, 3, {"openai": 3}, {}, {"system_conflict": 1}),
    "list_lines.jsonl": (4, 3, {"openai": 2, "sharegpt": 1}, {"not_an_object": 1}, {}),
    "flags.jsonl": (7, 5, {"openai": 6, "sharegpt": 1}, {"trained_non_assistant": 1, "invalid_train_flag": 1},
                    {"untrained_answer": 5}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_shape_balances_and_round_trips(name: str, tmp_path: Path) -> None:
    rows_in, kept, formats, rejected, warnings = EXPECTED[name]
    convs, report = _read(name)
    assert (report.rows_in, len(convs)) == (rows_in, kept)
    assert (dict(report.formats), dict(report.rejected), dict(report.warnings)) == (
        formats,
        rejected,
        warnings,
    )
    for to in ("openai", "sharegpt"):
        out = tmp_path / f"{to}.jsonl"
        rep = convert([VENDORS / name], out, to)
        assert rep.rows_out == kept and rep.warnings.get("unrepresentable_field", 0) == 0
        again, _ = _read_file(out)
        assert [_shape(c) for c in again] == [_shape(c) for c in convs], to  # nothing lost on the way
        assert b"REJECTED-SIDE" not in out.read_bytes()  # a preference row's rejected side never leaves


def _read_file(path: Path) -> tuple[list[Conversation], Report]:
    report = Report()
    convs = list(read_conversations([path], report, ConvertOptions()))
    convs.sort(key=lambda c: c.origin() or ("", 0))  # the original rows, as _read sorts them
    return convs, report


def test_anthropic_blocks_become_structure() -> None:
    [weather, config, redacted], _ = _read("anthropic.jsonl")
    assert _shape(weather) == [
        ("system", "You are a weather bot.", None, [], None, None),
        ("user", "What is the weather in Paris?", None, [], None, None),
        ("assistant", "Let me check.", "The user wants Paris weather; call the tool.",
         [("get_weather", {"city": "Paris"}, "toolu_01A09q90qw90lq917835lq9")], None, None),
        ("tool", "18 degrees, sunny", None, [], "toolu_01A09q90qw90lq917835lq9", None),
        ("assistant", "It is 18 degrees and sunny in Paris.", None, [], None, None),
    ]  # fmt: skip
    assert weather.tools[0]["function"]["parameters"]["required"] == ["city"]  # input_schema renamed
    roles = [(m.role, m.content, m.is_error) for m in config.messages]
    assert roles[:5] == [
        ("system", "Answer in one line.", False),
        ("user", "Read config.yaml", False),
        ("assistant", "", False),
        ("tool", "No such file", True),  # is_error kept
        ("user", "Try config.yml instead.", False),  # the text beside the result, after it
    ]
    assert (redacted.messages[1].redacted_reasoning or "").startswith("EmwK")
    assert redacted.messages[1].reasoning is None and redacted.messages[1].content.startswith("The proof")


def test_gemini_parts_and_both_spellings() -> None:
    [pirate, tokyo, calc], _ = _read("gemini.jsonl")
    assert [(m.role, m.content) for m in pirate.messages] == [
        ("system", "You are a pirate."), ("user", "Hello!"), ("assistant", "Ahoy, matey!")]  # fmt: skip
    call = tokyo.messages[1]
    assert (call.reasoning, [(c.name, c.arguments) for c in call.tool_calls]) == (
        "The user wants Tokyo time.", [("get_time", {"city": "Tokyo"})])  # fmt: skip
    assert (tokyo.messages[2].role, tokyo.messages[2].name, json.loads(tokyo.messages[2].content)) == (
        "tool", "get_time", {"time": "21:04"})  # fmt: skip
    assert tokyo.tools == [{"type": "function", "function": {
        "name": "get_time", "description": "time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
    assert [m.role for m in calc.messages] == ["system", "user", "assistant", "tool", "assistant"]


def test_glaive_text_becomes_turns_and_calls() -> None:
    [news, plain, broken], _ = _read("glaive.jsonl")
    assert [m.role for m in news.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    system = news.messages[0].content
    assert system.startswith("You are a helpful assistant") and "{" not in system  # the functions moved
    assert news.tools[0]["function"]["name"] == "get_news_headlines"
    assert [(c.name, c.arguments) for c in news.messages[2].tool_calls] == [
        ("get_news_headlines", {"country": "United States"})]  # fmt: skip
    assert news.messages[3].name == "get_news_headlines"
    assert all("<|endoftext|>" not in m.content and "ASSISTANT:" not in m.content for m in news.messages)
    assert (plain.tools, plain.messages[0].content) == (
        [],
        "You are a helpful assistant, with no access to external functions.",
    )
    assert (
        broken.messages[-1].tool_calls == [] and "<functioncall>" in broken.messages[-1].content
    )  # kept as text


def test_hermes_tags_lift_unless_kept() -> None:
    [stocks, oslo, broken], _ = _read("hermes.jsonl")
    assert [c.arguments for c in stocks.messages[2].tool_calls] == [{"symbol": "AAPL"}, {"symbol": "MSFT"}]
    assert stocks.messages[2].content == ""
    assert [(m.role, m.name) for m in stocks.messages[3:5]] == [("tool", "get_stock_price")] * 2
    assert (oslo.messages[1].content, oslo.messages[2].content) == ("Checking.", '{"temp": -3}')
    assert "<tool_call>" in broken.messages[1].content and not broken.messages[1].tool_calls
    kept, report = _read("hermes.jsonl", tool_tags="keep")
    assert dict(report.formats) == {"sharegpt": 2, "openai": 1}
    assert all(not m.tool_calls for c in kept for m in c.messages)


def test_preference_rows_read_as_the_chosen_conversation() -> None:
    convs, _ = _read("preference.jsonl")
    assert [[(m.role, m.content[:20]) for m in c.messages] for c in convs] == [
        [("system", "Be helpful."), ("user", "Hello, can you tell "), ("assistant", "Today in San Francis")],
        [("user", "Write a haiku."), ("assistant", "Silent pond, a frog.")],
        [("user", "The sky is"), ("assistant", " blue.")],
        [("user", "What is 3*3?"), ("assistant", "3*3 is 9.")],
        [("user", "Best sorting algorit"), ("assistant", "Insertion sort: it r")],
    ]
    assert convs[3].meta == {"prompt_id": "p9", "score_chosen": 9.0, "score_rejected": 2.0}
    refused, report = _read("preference.jsonl", preference="reject")
    assert refused == [] and dict(report.rejected) == {"preference_row": 5}


def test_flags_are_kept_and_written(tmp_path: Path) -> None:
    convs, report = _read("flags.jsonl")
    assert [[m.train for m in c.messages if m.role == "assistant"] for c in convs] == [
        [False, True], [False, None], [False, True], [False, True], [False]]  # fmt: skip
    assert report.examples["trained_non_assistant"][0].line == 5
    out = tmp_path / "o.jsonl"
    convert([VENDORS / "flags.jsonl"], out, "openai")
    first = json.loads(out.read_text().splitlines()[0])
    assert [m.get("weight") for m in first["messages"]] == [None, 0, None, 1]
    out = tmp_path / "s.jsonl"
    convert([VENDORS / "flags.jsonl"], out, "sharegpt")
    fourth = json.loads(out.read_text().splitlines()[3])
    assert [t.get("weight") for t in fourth["conversations"]] == [None, 0, None, 1]


SHAPES = ["anthropic.jsonl", "gemini.jsonl", "glaive.jsonl", "hermes.jsonl", "preference.jsonl",
          "openai_system.jsonl", "list_lines.jsonl", "flags.jsonl"]  # fmt: skip


def test_tokenize_masks_are_exact(tmp_path: Path, qwen_dir: Path, qwen_tok: Any) -> None:
    """Each shape's converted output tokenized with the target's template: every trained run decodes
    to an answer of the source, an untrained answer is in the tokens and out of the loss."""
    converted = []
    for name in SHAPES:
        out = tmp_path / f"{name}.openai.jsonl"
        convert([VENDORS / name], out, "openai")
        converted.append(out)
    report = tokenize_files(converted, tmp_path / "ds", TokenizeOptions(qwen_dir, workers=1, verify_all=True))
    # flags.jsonl's f7 has only an untrained answer: nothing to train, refused by name; Qwen's template
    # refuses a second system message (openai_system.jsonl's b2 keeps both, warned at convert)
    assert dict(report.rejected) == {"no_trained_tokens": 1, "template_error": 1}
    assert report.examples["no_trained_tokens"][0].reason == "all 1 answers are untrained by their flag"
    assert report.examples["template_error"][0].reason == "System message must be at the beginning."
    ds = ShardDataset(tmp_path / "ds")
    rows = [ds.row(i) for i in range(len(ds))]
    trained = "".join(t for r in rows for t in trained_runs(qwen_tok, r["input_ids"], r["loss_mask"]))
    context = "".join(untrained_text(qwen_tok, r["input_ids"], r["loss_mask"]) for r in rows)
    for answer in ("It is 18 degrees and sunny in Paris.", "Ahoy, matey!", "It is 21:04 in Tokyo.",
                   "Sorry: it is four.", "A good joke here.", "Farewell, friend.", "Blue.",
                   "AAPL trades at 189.5", "Insertion sort", "Debug mode is on."):  # fmt: skip
        assert answer in trained, answer
    for untrained in ("It is five, obviously.", "A bad joke here.", "Greetings, friend.", "Blurple."):
        assert untrained in context and untrained not in trained, untrained
    for prompt in ("What is the weather in Paris?", "You are a pirate.", "Be kind."):
        assert prompt in context and prompt not in trained
    # structure reached the template: the call and its result render as the target's own tags
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in trained
    assert "<tool_response>\n18 degrees, sunny\n</tool_response>" in context
    assert "REJECTED-SIDE" not in trained + context
    flagged = [r for r in rows if "untrained_answer" in r.get("issues", [])]
    assert len(flagged) == 4  # the sample view's badge: rows whose answers a flag left out


def _one(row: Any, **opts: Any) -> tuple[str, list[Conversation], dict[str, str]]:
    from draftdeck.formats.common import ParseContext, ParseOptions
    from draftdeck.formats.detect import parse

    ctx = ParseContext(ParseOptions(**opts))
    family, convs = parse(row, ctx)
    return family, convs, ctx.warnings


def test_train_flag_values() -> None:
    def flags(**extra: Any) -> tuple[bool | None, dict[str, str]]:
        row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", **extra}]}
        _, [conv], warnings = _one(row)
        return conv.messages[1].train, warnings

    assert flags(weight=0) == (False, {}) and flags(weight=1) == (True, {})
    assert flags(loss=False) == (False, {}) and flags(train=True) == (True, {})
    assert flags(loss_weight=0.0) == (False, {})
    train, warnings = flags(loss_weight=0.5)
    assert train is True and "0.5" in warnings["partial_loss_weight"]
    assert "invalid_train_flag" in flags(loss="no")[1]
    assert "invalid_train_flag" in flags(weight=True)[1]  # a boolean is not OpenAI's 0 or 1
    assert "disagree" in flags(weight=1, loss=False)[1]["invalid_train_flag"]


def test_role_aliases_and_no_silent_loss() -> None:
    from draftdeck.formats.common import RowRejected

    family, [conv], _ = _one(
        {"conversations": [{"from": "human", "value": "q"}, {"from": "chatbot", "value": "a"}]}
    )
    assert (family, [m.role for m in conv.messages]) == ("sharegpt", ["user", "assistant"])
    _, _, warnings = _one({"messages": [{"role": "user", "content": "q"}], "tools": "not json"})
    assert "lost_tools" in warnings  # the template would have rendered them: the row is refused
    _, _, warnings = _one(
        {"messages": [{"role": "user", "content": [{"type": "refusal_note", "text": "x"}]}]}
    )
    assert "refusal_note" in warnings["lost_part"]
    _, _, warnings = _one({"system": 42, "messages": [{"role": "user", "content": "q"}]})
    assert "lost_system" in warnings
    image_result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                    "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]}  # fmt: skip
    with pytest.raises(RowRejected, match="image"):
        _one({"messages": [{"role": "user", "content": "q"}, image_result]})


def test_from_names_the_vendor_shapes() -> None:
    from draftdeck.formats.common import RowRejected

    openai_row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    with pytest.raises(RowRejected, match=r"not anthropic .* it reads as openai"):
        _one(openai_row, from_format="anthropic")
    with pytest.raises(RowRejected, match="not hermes"):
        _one(openai_row, from_format="hermes")
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    tagged = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": call}]}
    family, [conv], _ = _one(tagged, from_format="hermes", tool_tags="keep")  # --from hermes always lifts
    assert (family, conv.messages[1].tool_calls[0].name) == ("hermes", "f")
