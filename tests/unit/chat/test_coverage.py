"""Nothing the conversation holds vanishes in the chat template: a tool-call file tokenized with a
template that renders only `content` (the demo target's) rejects its tool-call rows naming the part
dropped; the same file with a template that renders tools (Qwen3.6's) keeps them, with the calls in
the trained tokens; a part the template drops on purpose can be allowed, and is then warned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftdeck.chat import testing
from draftdeck.chat.coverage import dropped
from draftdeck.chat.render import load_tokenizer
from draftdeck.chat.spans import RenderedRow
from draftdeck.drafter.tiny import CHAT_TEMPLATE as CONTENT_ONLY
from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.conftest import FIXTURES
from tests.support.tokenize import trained_runs

# 3 rows: a tool call with its result and answer, a plain answer, a call whose arguments do not parse
# (kept as the answer's text, not as a call)
GLAIVE = FIXTURES / "vendors" / "glaive.jsonl"
REASONING = FIXTURES / "tokenize" / "chat.jsonl"


def test_a_template_that_drops_tool_calls_rejects_those_rows_by_name(tmp_path: Path) -> None:
    content_only = testing.small_bpe_tokenizer(chat_template=CONTENT_ONLY)
    report = tokenize_files([GLAIVE], tmp_path / "ds", TokenizeOptions(content_only, workers=1))
    report.check_accounting()
    assert (report.rows_in, report.rows_out) == (3, 2)
    assert report.rejected == {"template_dropped_tool_calls": 1}
    reason = report.examples["template_dropped_tool_calls"][0].reason
    assert "tool call 'get_news_headlines'" in reason and "--chat-template" in reason


def test_a_template_that_renders_them_keeps_the_calls_in_the_trained_tokens(tmp_path: Path) -> None:
    qwen = testing.qwen36_tokenizer()
    tok = load_tokenizer(qwen)
    report = tokenize_files([GLAIVE], tmp_path / "ds", TokenizeOptions(qwen, workers=1, verify_all=True))
    report.check_accounting()
    assert dict(report.rejected) == {} and report.rows_out == 3 + report.rows_expanded
    ds = ShardDataset(tmp_path / "ds")
    trained = [
        "".join(trained_runs(tok, r["input_ids"], r["loss_mask"])) for r in map(ds.row, range(len(ds)))
    ]
    calls = [t for t in trained if "<tool_call>" in t]
    assert len(calls) == 1 and "get_news_headlines" in calls[0] and "country" in calls[0]


def test_dropped_reasoning_is_rejected_unless_allowed(tmp_path: Path) -> None:
    content_only = testing.small_bpe_tokenizer(chat_template=CONTENT_ONLY)
    opts = dict(workers=1, on_missing="drop")
    strict = tokenize_files([REASONING], tmp_path / "a", TokenizeOptions(content_only, **opts))  # type: ignore[arg-type]
    assert strict.rejected["template_dropped_reasoning"] >= 1
    allowed = TokenizeOptions(content_only, template_may_drop=["reasoning"], **opts)  # type: ignore[arg-type]
    kept = tokenize_files([REASONING], tmp_path / "b", allowed)
    kept.check_accounting()
    assert "template_dropped_reasoning" not in kept.rejected
    assert kept.warnings["template_dropped_reasoning"] >= strict.rejected["template_dropped_reasoning"]
    assert kept.rows_out > strict.rows_out


def test_parts_are_found_by_their_text_in_any_template_format() -> None:
    call = {"function": {"name": "book", "arguments": {"city": 'Zürich "Old Town"', "nights": 3}}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Book it"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    tools = [{"type": "function", "function": {"name": "book"}}]
    head = "<|im_start|>system\nBe brief.\nTools: book<|im_end|>\n<|im_start|>assistant\n"
    for answer in (
        '{"name": "book", "arguments": {"city": "Zürich \\"Old Town\\"", "nights": 3}}',  # tojson
        '<function=book>\n<parameter=city>\nZürich "Old Town"\n</parameter>\n'
        "<parameter=nights>\n3\n</parameter>",  # Qwen3.5's XML parameters
    ):
        text = head + answer + "<|im_end|>"
        assert dropped(messages, tools, [RenderedRow(text, [(len(head), len(text))])]) == []
    bare = head.replace("Tools: book", "") + "<|im_end|>"
    codes = [code for code, _ in dropped(messages, tools, [RenderedRow(bare, [(len(bare) - 10, len(bare))])])]
    assert codes == ["template_dropped_tool_calls", "template_dropped_tools"]
    no_system = bare.replace("Be brief.", "")
    codes = [code for code, _ in dropped(messages, None, [RenderedRow(no_system, [(0, len(no_system))])])]
    assert codes == ["template_dropped_tool_calls", "template_dropped_system"]
