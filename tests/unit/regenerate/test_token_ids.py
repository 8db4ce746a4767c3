"""Regenerate records the target's own token ids (local generation; a server's `token_ids`, `output_ids`
or `token_id:N` logprobs), and they reach the shards verbatim through convert and tokenize."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draftdeck.chat.render import load_tokenizer
from draftdeck.chat.testing import small_bpe_tokenizer
from draftdeck.convert.run import convert
from draftdeck.jobs.context import LocalContext
from draftdeck.provenance import vocab_fingerprint
from draftdeck.regenerate import RegenerateParams, run_regenerate
from draftdeck.regenerate.answer import parse_completion
from draftdeck.regenerate.testing import tiny_qwen3
from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.support.regen_standin import StandIn, completion, standin
from tests.support.tokenize import id_runs


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _prompts(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


def _counts(ds: ShardDataset) -> dict[str, Any]:
    """The counts the dataset's manifest records (a tokenize run's manifest has its report)."""
    assert ds.manifest.report is not None
    return ds.manifest.report["counts"]


def _tokenized(src: Path, to: str, tokenizer: Path, tmp_path: Path, **kw: Any) -> ShardDataset:
    """`src` converted to `to` and tokenized: the path a regenerated file takes to training."""
    converted = tmp_path / f"converted.{'parquet' if to == 'parquet' else 'jsonl'}"
    convert([src], converted, to)
    tokenize_files([converted], tmp_path / "ds", TokenizeOptions(tokenizer, workers=1, verify_all=True, **kw))
    return ShardDataset(tmp_path / "ds")


@pytest.mark.parametrize(
    ("choice", "ids"),
    [
        ({"token_ids": [5, 6, 7]}, [5, 6, 7]),  # vLLM, asked with return_token_ids
        ({"output_ids": [5, 6]}, [5, 6]),
        ({"logprobs": {"content": [{"token": "token_id:9"}, {"token": "token_id:12"}]}}, [9, 12]),
        ({"logprobs": {"content": [{"token": "Hello"}]}}, None),  # text tokens: no ids
        ({"token_ids": [1, "x"]}, None),
    ],
)
def test_an_answers_ids_are_read_in_each_spelling(choice: dict[str, Any], ids: list[int] | None) -> None:
    body = {
        "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop", **choice}]
    }
    assert parse_completion(body, "http://x").token_ids == ids


def test_a_servers_token_ids_reach_the_shards_verbatim(tmp_path: Path) -> None:
    tok_dir = small_bpe_tokenizer()
    tok = load_tokenizer(tok_dir)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    text = "the capital is paris"
    # the target split a word otherwise than the tokenizer would: only its own ids show it
    split = [*tok.encode(text[:6], add_special_tokens=False), *tok.encode(text[6:], add_special_tokens=False)]
    assert split != tok.encode(text, add_special_tokens=False)

    def answer(messages: list[dict[str, Any]], n: int) -> tuple[int, Any]:
        status, body = completion(text)
        if "question 0" in messages[-1]["content"]:
            body["choices"][0]["token_ids"] = [*split, im_end]  # vLLM's field, the stop token included
        return status, body

    with standin(StandIn(answer)) as server:
        params = RegenerateParams(inputs=[str(_prompts(tmp_path, 2))], out=str(tmp_path / "regen.jsonl"),
                                  endpoints=[server.url], model="m", concurrency=1)  # fmt: skip
        report = run_regenerate(params, LocalContext(tmp_path / "ctx"))
    assert all(body["return_token_ids"] is True for body in server.requests)
    regen = report.extra["regenerate"]
    assert (regen["answers"], regen["answers_with_token_ids"]) == (2, 1)
    rows = _rows(tmp_path / "regen.jsonl")
    assert rows[0]["messages"][-1]["token_ids"] == [*split, im_end]
    assert rows[0]["generation"]["token_ids"] == {"vocab": None}  # a server's vocabulary is not known
    assert "token_ids" not in rows[1]["messages"][-1] and "token_ids" not in rows[1]["generation"]
    ds = _tokenized(tmp_path / "regen.jsonl", "sharegpt", tok_dir, tmp_path)
    assert id_runs(ds.row(0)["input_ids"], ds.row(0)["loss_mask"]) == [[*split, im_end]]
    assert ds.row(0)["issues"] == ["ids_from_target"] and ds.row(1)["issues"] == []
    counts = _counts(ds)
    assert counts["ids_from_target"] == 1 and "ids_reencoded" not in counts


def test_local_generation_keeps_its_ids_through_parquet_into_the_shards(tmp_path: Path) -> None:
    model = tiny_qwen3(tmp_path / "tiny")
    rows = [{"messages": [{"role": "user", "content": f"Prompt {i}"}, {"role": "user", "content": "more"}]}
            for i in range(4)]  # fmt: skip
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = RegenerateParams(inputs=[str(tmp_path / "in.jsonl")], out=str(tmp_path / "regen.jsonl"),
                              local=str(model), max_tokens=6, reasoning=False, keep_cut_off=True)  # fmt: skip
    report = run_regenerate(params, LocalContext(tmp_path / "ctx"))
    regen = report.extra["regenerate"]
    assert regen["answers"] == regen["answers_with_token_ids"] == 8
    out = _rows(tmp_path / "regen.jsonl")
    recorded = [m["token_ids"] for r in out for m in r["messages"] if m["role"] == "assistant"]
    assert all(r["generation"]["token_ids"]["vocab"] == vocab_fingerprint(model) for r in out)
    # tokenized with the template settings regenerate used (reasoning off), every answer keeps its ids
    ds = _tokenized(
        tmp_path / "regen.jsonl", "parquet", model, tmp_path, template_kwargs={"enable_thinking": False}
    )
    counts = _counts(ds)
    assert counts["answers_ids_from_target"] == 8 and "answers_ids_reencoded" not in counts
    trained = [run for i in range(len(ds)) for run in id_runs(ds.row(i)["input_ids"], ds.row(i)["loss_mask"])]
    im_end = load_tokenizer(model).convert_tokens_to_ids("<|im_end|>")
    # an answer that ended on an ordinary stop token gets the template's end-of-turn after it
    assert trained == [ids if ids[-1] == im_end else [*ids, im_end] for ids in recorded]
