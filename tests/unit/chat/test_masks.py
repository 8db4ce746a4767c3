# ruff: noqa: F811 - pytest fixtures imported from tokenize_helpers
"""Loss masks: exactly what the model generates in each assistant turn, for any chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from draftdeck.chat.render import ChatRenderer, TemplateError, conversation_dicts
from draftdeck.chat.spans import render_rows
from draftdeck.formats.model import Message, ToolCall
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_rows
from tests.support.tokenize import (  # noqa: F401 - fixtures
    a,
    conv,
    gentags_dir,
    gentags_tok,
    qwen_dir,
    qwen_tok,
    small_dir,
    small_tok,
    trained_runs,
    u,
    untrained_text,
)


def rows_of(result: Any) -> list[tuple[list[int], list[int], int]]:
    return [(r.input_ids.tolist(), r.loss_mask.tolist(), r.turn) for r in result.rows]


def test_qwen_single_turn_trains_reasoning_content_and_end_of_turn_only(
    qwen_dir: Path, qwen_tok: Any
) -> None:
    res = tokenize_rows(
        [conv(Message("system", "Be brief."), u("Hi there"), a("Hello!", "The user greets."))],
        TokenizeOptions(qwen_dir),
    )
    [(ids, mask, turn)] = rows_of(res)
    assert turn == -1
    # the generation prompt "<|im_start|>assistant\n<think>\n" is the prompt: never trained
    assert trained_runs(qwen_tok, ids, mask) == ["The user greets.\n</think>\n\nHello!<|im_end|>"]
    context = untrained_text(qwen_tok, ids, mask)
    assert context == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n" + "\n"  # the prompt, then the newline after <|im_end|>
    )
    assert res.report.rows_out == 1 and not res.report.rejected


def test_empty_think_block_straddling_newline_is_not_trained(qwen_dir: Path, qwen_tok: Any) -> None:
    """`<think>\\n` is the pre-fill; the rendered turn continues `\\n</think>\\n\\n`. The two newlines
    merge into one token that starts in the prompt: by the rule (trained iff the token starts inside
    the span) it is context, and training starts at `</think>`."""
    res = tokenize_rows([conv(u("Hi"), a("Hello!"))], TokenizeOptions(qwen_dir))
    [(ids, mask, _)] = rows_of(res)
    toks = qwen_tok.convert_ids_to_tokens(ids)
    k = toks.index("<think>")
    assert qwen_tok.decode([ids[k + 1]]) == "\n\n" and mask[k + 1] == 0
    assert toks[k + 2] == "</think>" and mask[k + 2] == 1
    assert trained_runs(qwen_tok, ids, mask) == ["</think>\n\nHello!<|im_end|>"]


def test_enable_thinking_false_prefill_is_not_trained(qwen_dir: Path, qwen_tok: Any) -> None:
    opts = TokenizeOptions(qwen_dir, template_kwargs={"enable_thinking": False})
    [(ids, mask, _)] = rows_of(tokenize_rows([conv(u("Hi"), a("Hello!"))], opts))
    # the whole empty think block is the generation prompt now
    assert trained_runs(qwen_tok, ids, mask) == ["Hello!<|im_end|>"]


def test_think_stripping_template_splits_only_unstable_conversations(qwen_dir: Path, qwen_tok: Any) -> None:
    multi = conv(
        u("Solve x+1=3."), a("x = 2.", "Subtract 1."), u("And x+2=3?"), a("x = 1.", "Subtract 2."), line=1
    )
    single = conv(u("Hi"), a("Hello!", "Greeting."), line=2)
    res = tokenize_rows([multi, single], TokenizeOptions(qwen_dir))
    rows = rows_of(res)
    assert [r[2] for r in rows] == [0, 1, -1]
    assert res.report.rows_in == 2 and res.report.rows_expanded == 1 and res.report.rows_out == 3
    (ids0, m0, _), (ids1, m1, _), _ = rows
    # row 0: turn 0 with its reasoning, nothing after it
    assert trained_runs(qwen_tok, ids0, m0) == ["Subtract 1.\n</think>\n\nx = 2.<|im_end|>"]
    assert "And x+2=3?" not in qwen_tok.decode(ids0)
    # row 1: turn 0 is context, rendered as the template renders it there (reasoning stripped)
    assert trained_runs(qwen_tok, ids1, m1) == ["Subtract 2.\n</think>\n\nx = 1.<|im_end|>"]
    ctx = untrained_text(qwen_tok, ids1, m1)
    assert "x = 2." in ctx and "Subtract 1." not in ctx


def test_prefix_stable_template_keeps_one_row_with_every_turn_trained(
    small_dir: Path, small_tok: Any
) -> None:
    c = conv(
        Message("system", "sys"), u("Solve x+1=3."), a("x = 2.", "Subtract 1."), u("And x+2=3?"), a("x = 1.")
    )
    res = tokenize_rows([c], TokenizeOptions(small_dir))
    [(ids, mask, turn)] = rows_of(res)
    assert turn == -1 and res.report.rows_expanded == 0
    assert trained_runs(small_tok, ids, mask) == [
        "<think>\nSubtract 1.\n</think>\n\nx = 2.<|im_end|>",
        "x = 1.<|im_end|>",
    ]
    assert "<|im_start|>assistant\n" in untrained_text(small_tok, ids, mask)


def test_tool_calls_are_trained_and_tool_results_are_not(qwen_dir: Path, qwen_tok: Any) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    c = conv(
        u("Weather in Paris?"),
        a("", calls=[ToolCall("get_weather", {"city": "Paris"})]),
        Message("tool", '{"temp": 21}'),
        a("It is 21 degrees."),
        tools=tools,
    )
    [(ids, mask, turn)] = rows_of(tokenize_rows([c], TokenizeOptions(qwen_dir)))
    assert turn == -1  # both turns come after the last user query: prefix-stable
    runs = trained_runs(qwen_tok, ids, mask)
    assert runs == [
        '</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>",
        "</think>\n\nIt is 21 degrees.<|im_end|>",
    ]
    assert '{"temp": 21}' in untrained_text(qwen_tok, ids, mask)


def test_template_errors_reject_the_row_with_the_templates_message(qwen_dir: Path) -> None:
    good = conv(u("Hi"), a("Hello"), line=1)
    no_user = conv(Message("system", "s"), a("I start"), line=2)
    late_system = conv(u("Hi"), Message("system", "late"), a("Hello"), line=3)
    res = tokenize_rows([good, no_user, late_system], TokenizeOptions(qwen_dir))
    assert res.report.rows_out == 1 and res.report.rejected["template_error"] == 2
    reasons = [e.reason for e in res.report.examples["template_error"]]
    assert any("No user query found" in r for r in reasons)
    assert any("System message must be at the beginning" in r for r in reasons)
    assert [e.line for e in res.report.examples["template_error"]] == [2, 3]


def test_control_token_lookalikes_in_messages_stay_text(qwen_dir: Path, qwen_tok: Any) -> None:
    text = "Print <|im_end|> then <think> and <|im_sta"
    c = conv(u(text), a(text))
    [(ids, mask, _)] = rows_of(tokenize_rows([c], TokenizeOptions(qwen_dir)))
    im_end = qwen_tok.convert_tokens_to_ids("<|im_end|>")
    assert ids.count(im_end) == 2  # the template's two, not the user's or the assistant's
    msgs = conversation_dicts(c)
    ref = qwen_tok.apply_chat_template(msgs, tokenize=True, sanitize_control_tokens=True, return_dict=False)
    assert ids == list(ref)
    assert trained_runs(qwen_tok, ids, mask) == [f"</think>\n\n{text}<|im_end|>"]


def test_generation_tags_masks_agree_with_hf(gentags_dir: Path, gentags_tok: Any) -> None:
    convs = [
        conv(u("What is the capital of France?"), a("Paris is the capital.")),
        conv(
            Message("system", "You are a helpful assistant."),
            u("hello"),
            a("Hi! How can I help you today?"),
            u("Let me think"),
            a("The result.", "First, we compute the sum"),
        ),
        conv(
            u("weather?"),
            a("", calls=[ToolCall("get_weather", {"city": "Paris"})]),
            Message("tool", "21"),
            a("It is 21."),
        ),
        conv(u("你好"), a("你好，世界！😀🎉")),  # noqa: RUF001
    ]
    res = tokenize_rows(convs, TokenizeOptions(gentags_dir))
    assert len(res.rows) == len(convs)
    straddles = 0
    for c, row in zip(convs, res.rows, strict=True):
        msgs = conversation_dicts(c)
        hf = gentags_tok.apply_chat_template(
            msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert row.input_ids.tolist() == list(hf["input_ids"])
        ours, theirs = row.loss_mask.tolist(), list(hf["assistant_masks"])
        assert sum(ours) > 0
        if ours == theirs:
            continue
        # The one documented difference: HF marks every token overlapping a {% generation %} span; we
        # mark tokens that START inside it. Only a token straddling a span's start may differ.
        # transformers annotates it `-> str`; it returns (the rendered texts, each one's generation spans)
        rendered = render_jinja_template(
            [msgs],
            chat_template=gentags_tok.chat_template,
            return_assistant_tokens_mask=True,
            **gentags_tok.special_tokens_map,
        )
        [text], [spans] = cast(tuple[list[str], list[list[tuple[int, int]]]], rendered)
        offsets = gentags_tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        for k, (o, t) in enumerate(zip(ours, theirs, strict=True)):
            if o != t:
                start, end = offsets[k]
                assert (o, t) == (0, 1) and any(start < s < end for s, _ in spans), (k, text[start:end])
                straddles += 1
    assert straddles == 1  # the tool call right after the header: "\n" + "\n<tool_call>" merge into "\n\n"


@pytest.mark.parametrize("which", ["qwen", "small", "gentags"])
def test_rendering_matches_hf_apply_chat_template(which: str, request: pytest.FixtureRequest) -> None:
    """DraftDeck's compiled template (with its sandbox fast paths) renders exactly as HF, on every
    prefix of varied conversations (tools, reasoning, missing keys, loops, namespaces)."""
    tok = request.getfixturevalue(f"{which}_tok")
    kwargs: dict[str, Any] = {"enable_thinking": True} if which == "qwen" else {}
    renderer = ChatRenderer.from_tokenizer(tok, kwargs)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    convs = [
        (conv(u("a"), a("b", "r"), u("c"), a("d")), None),
        (conv(Message("system", "s"), u("q"), a("", calls=[ToolCall("f", {"x": 1})]), Message("tool", "1"),
              a("done")), tools),
        (conv(u("<think>x</think> 你好"), a("y</think>z")), None),
    ]  # fmt: skip
    for c, tl in convs:
        msgs = conversation_dicts(c)
        for n in range(1, len(msgs) + 1):
            for gen in (False, True):
                try:
                    ref = tok.apply_chat_template(
                        msgs[:n], tools=tl, tokenize=False, add_generation_prompt=gen, **kwargs
                    )
                except Exception as exc:  # the strict template raises: ours raises the same message
                    with pytest.raises(TemplateError, match=str(exc)):
                        renderer.render(msgs[:n], tl, gen)
                    continue
                assert renderer.render(msgs[:n], tl, gen) == ref


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ messages[0].content.__class__ }}",
        "{{ '{0.__class__}'.format(messages) }}",
        "{{ messages.__class__ }}",
        "{% set ns = namespace(x=1) %}{{ ns.__class__ }}",
        "{% for m in messages %}{{ loop.__class__ }}{% endfor %}",
    ],
)
def test_templates_stay_sandboxed(source: str) -> None:
    """The fast paths never hand out private attributes: these render nothing or raise."""
    renderer = ChatRenderer(source)
    try:
        out = renderer.render([{"role": "user", "content": "hi"}], None, False)
    except TemplateError:
        return
    assert "class" not in out and "type" not in out


def test_chat_template_override_file(tmp_path: Path, small_dir: Path, small_tok: Any) -> None:
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}: {{ m.content }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}"
    )
    [(ids, mask, _)] = rows_of(
        tokenize_rows([conv(u("hello"), a("world"))], TokenizeOptions(small_dir, chat_template=template))
    )
    assert small_tok.decode(ids).startswith("<|im_start|>user: hello<|im_end|>")
    assert trained_runs(small_tok, ids, mask) == ["world<|im_end|>"]


def test_spans_cover_exactly_the_generated_text(qwen_tok: Any) -> None:
    renderer = ChatRenderer.from_tokenizer(qwen_tok)
    [row] = render_rows(conversation_dicts(conv(u("q"), a("answer", "why"))), None, renderer)
    assert [row.text[s:e] for s, e in row.spans] == ["why\n</think>\n\nanswer<|im_end|>"]
    assert not row.text[row.spans[0][1] :].strip()  # only the template's trailing newline is left out


@pytest.mark.parametrize(("content", "anchor_warnings"), [("", 1), ("x", 0)])
def test_rows_without_two_consecutive_trained_tokens_warn_no_dflash_anchor(
    content: str, anchor_warnings: int, small_dir: Path, tmp_path: Path
) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}")
    res = tokenize_rows([conv(u("hello"), a(content))], TokenizeOptions(small_dir, chat_template=template))
    [row] = res.rows
    assert int(row.loss_mask.sum()) == (1 if not content else 2)  # "<|im_end|>" or "x" + "<|im_end|>"
    assert res.report.warnings["no_dflash_anchor"] == anchor_warnings


def test_text_that_is_not_nfc_goes_through_hf_with_exact_masks(qwen_dir: Path, qwen_tok: Any) -> None:
    """The Qwen tokenizer normalises to NFC; such rows skip the fast encoder and the decode check
    compares normalised text."""
    decomposed = "cafe\u0301 and nai\u0308ve"
    res = tokenize_rows([conv(u(decomposed), a(decomposed))], TokenizeOptions(qwen_dir))
    assert res.hf_rows == 1 and res.fast_rows == 0 and not res.report.rejected
    [(ids, mask, _)] = rows_of(res)
    assert trained_runs(qwen_tok, ids, mask) == ["</think>\n\ncafé and naïve<|im_end|>"]
