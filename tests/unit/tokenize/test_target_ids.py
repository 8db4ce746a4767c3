# ruff: noqa: F811 - pytest fixtures imported from tests.support.tokenize
"""The target's recorded token ids in place of its re-encoded text: used verbatim where they fit,
counted and warned where they do not (another vocabulary, an edited answer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from draftdeck.formats.model import Conversation, Message, SourceRef
from draftdeck.provenance import vocab_fingerprint
from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_conversations, tokenize_rows
from tests.support.tokenize import id_runs, qwen_dir, qwen_tok, u  # noqa: F401

OFF = {"enable_thinking": False}  # the generation prompt holds the empty think block: spans are answers


def _split_ids(tok: Any, text: str, at: int) -> list[int]:
    """`text` encoded in two halves: ids that spell it but are not how the tokenizer splits it."""
    return [
        *tok.encode(text[:at], add_special_tokens=False),
        *tok.encode(text[at:], add_special_tokens=False),
    ]


def _answer(tok: Any, text: str, at: int, end: bool = True) -> Message:
    """An answer as a target wrote it: `text` split unusually at `at`, its end-of-turn token after."""
    ids = _split_ids(tok, text, at) + ([tok.convert_tokens_to_ids("<|im_end|>")] if end else [])
    return Message("assistant", text, token_ids=ids)


def _ids(answer: Message) -> list[int]:
    """The token ids `answer` carries (every `_answer` has them)."""
    assert answer.token_ids is not None
    return answer.token_ids


def _conv(*messages: Message, vocab: str | None, line: int = 1) -> Conversation:
    meta = {"generation": {"token_ids": {"vocab": vocab}}}
    return Conversation(list(messages), [], SourceRef("regen.jsonl", line), meta=meta)


def _opts(qwen_dir: Path) -> TokenizeOptions:
    return TokenizeOptions(qwen_dir, template_kwargs=OFF, workers=1, verify_all=True)


def test_the_targets_split_is_trained_not_the_tokenizers(qwen_dir: Path, qwen_tok: Any) -> None:
    text = "Photosynthesis converts light into chemical energy."
    answer = _answer(qwen_tok, text, 5)  # "Photo" + "synthesis ...": the tokenizer splits otherwise
    canonical = qwen_tok.encode(text, add_special_tokens=False)
    assert _ids(answer)[:-1] != canonical and qwen_tok.decode(_ids(answer)[:-1]) == text
    conv = _conv(u("What does photosynthesis do?"), answer, vocab=vocab_fingerprint(qwen_dir))
    result = tokenize_rows([conv], _opts(qwen_dir))
    [row] = result.rows
    assert id_runs(list(row.input_ids), list(row.loss_mask)) == [answer.token_ids]
    # the context before the answer is the generation prompt the template renders, encoded as always
    prompt = qwen_tok.apply_chat_template([{"role": "user", "content": "What does photosynthesis do?"}],
                                          add_generation_prompt=True, tokenize=False, **OFF)  # fmt: skip
    first = list(row.loss_mask).index(1)
    assert list(row.input_ids[:first]) == qwen_tok.encode(prompt, add_special_tokens=False)
    assert result.report.counts["ids_from_target"] == 1
    assert result.report.counts["answers_ids_from_target"] == 1
    assert row.issues == ["ids_from_target"] and not result.report.warnings


def test_every_turn_keeps_its_ids_and_a_missing_end_token_is_added(qwen_dir: Path, qwen_tok: Any) -> None:
    first = _answer(qwen_tok, "Paris is the capital.", 3, end=False)  # a server that leaves the stop out
    second = _answer(qwen_tok, "About two million people.", 4)
    conv = _conv(u("Capital of France?"), first, u("How many live there?"), second, vocab=None)
    result = tokenize_rows([conv], _opts(qwen_dir))
    im_end = qwen_tok.convert_tokens_to_ids("<|im_end|>")
    runs = [run for row in result.rows for run in id_runs(list(row.input_ids), list(row.loss_mask))]
    assert runs == [[*_ids(first), im_end], second.token_ids]
    assert result.report.counts["answers_ids_from_target"] == 2
    assert result.report.counts["ids_from_target"] == len(result.rows)


def test_whitespace_the_answer_parser_stripped_stays_in_the_targets_ids(
    qwen_dir: Path, qwen_tok: Any
) -> None:
    ids = [
        *qwen_tok.encode(" Yes.\n", add_special_tokens=False),
        qwen_tok.convert_tokens_to_ids("<|im_end|>"),
    ]
    conv = _conv(u("Is water wet?"), Message("assistant", "Yes.", token_ids=ids), vocab=None)
    [row] = tokenize_rows([conv], _opts(qwen_dir)).rows
    assert id_runs(list(row.input_ids), list(row.loss_mask)) == [ids]


@pytest.mark.parametrize(
    ("vocab", "content", "why"),
    [
        ("sha256:another", "Paris is the capital.", "recorded in another vocabulary"),
        (None, "Paris is the capital city.", "its ids decode to 'Paris is the capital.<|im_end|>'"),
    ],
    ids=["other-vocabulary", "edited-answer"],
)
def test_ids_that_do_not_fit_fall_back_to_the_text_and_say_why(
    qwen_dir: Path, qwen_tok: Any, vocab: str | None, content: str, why: str
) -> None:
    answer = _answer(qwen_tok, "Paris is the capital.", 3)
    answer.content = content  # (edited after the target answered, in the second case)
    result = tokenize_rows([_conv(u("Capital of France?"), answer, vocab=vocab)], _opts(qwen_dir))
    [row] = result.rows
    canonical = [
        *qwen_tok.encode(content, add_special_tokens=False),
        qwen_tok.convert_tokens_to_ids("<|im_end|>"),
    ]
    assert id_runs(list(row.input_ids), list(row.loss_mask)) == [canonical]
    report = result.report
    assert report.counts["ids_reencoded"] == 1 and report.counts["answers_ids_reencoded"] == 1
    assert report.warnings["ids_reencoded"] == 1 and "ids_reencoded" in row.issues
    [example] = report.examples["ids_reencoded"]
    assert example.file == "regen.jsonl" and example.line == 1 and why in example.reason


def test_rows_without_recorded_ids_count_on_neither_path_and_the_manifest_has_both(
    qwen_dir: Path, qwen_tok: Any, tmp_path: Path
) -> None:
    plain = Conversation([u("Hi"), Message("assistant", "Hello.")], [], SourceRef("plain.jsonl", 1))
    kept = _conv(u("Capital of France?"), _answer(qwen_tok, "Paris is the capital.", 3), vocab=None, line=2)
    other = _conv(u("Capital?"), _answer(qwen_tok, "Paris.", 2), vocab="sha256:another", line=3)
    report = tokenize_conversations([plain, kept, other], tmp_path / "ds", _opts(qwen_dir))
    assert report.rows_out == 3
    recorded = ShardDataset(tmp_path / "ds").manifest.report
    assert recorded is not None
    counts = recorded["counts"]
    assert (counts["ids_from_target"], counts["ids_reencoded"]) == (1, 1)
    issues = [ShardDataset(tmp_path / "ds").row(i)["issues"] for i in range(3)]
    assert issues == [[], ["ids_from_target"], ["ids_reencoded"]]
