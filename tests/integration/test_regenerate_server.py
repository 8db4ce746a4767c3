"""Regeneration against a real `transformers serve` (a tiny random Qwen3, offline, CPU) and the local
transformers backend on the same model folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from draftdeck.errors import JobFailed
from draftdeck.jobs.context import LocalContext
from draftdeck.quality import Report
from draftdeck.regenerate import RegenerateParams, run_regenerate
from draftdeck.regenerate.client import EndpointsDown
from draftdeck.regenerate.journal import journal_path
from draftdeck.regenerate.testing import free_port, tiny_qwen3, transformers_serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_qwen3(tmp_path_factory.mktemp("regen") / "tiny-qwen3")


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with transformers_serve(model_dir, log=tmp_path_factory.mktemp("serve") / "serve.log") as (url, _):
        yield url


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prompts(tmp_path: Path, n: int) -> Path:
    return _write(
        tmp_path / "prompts.jsonl", [{"prompt": f"Question {i}: what is {i} + {i}?"} for i in range(n)]
    )


def _params(inputs: Path, out: Path, url: str, model_dir: Path, **kw: Any) -> RegenerateParams:
    base: dict[str, Any] = {"max_tokens": 6, "reasoning": False, "concurrency": 4, "backoff_s": 0.2}
    return RegenerateParams(
        inputs=[str(inputs)], out=str(out), endpoints=[url], model=str(model_dir), **{**base, **kw}
    )


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _raw(url: str, model_dir: Path, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """The server's own answer to `messages`, asked with plain httpx."""
    body = {
        "model": str(model_dir),
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]


def test_cut_off_answers_are_rejected_by_default_and_kept_on_request(
    server: str, model_dir: Path, tmp_path: Path
) -> None:
    prompts = _prompts(tmp_path, 16)
    truth = [
        _raw(server, model_dir, [{"role": "user", "content": json.loads(line)["prompt"]}], 6)["finish_reason"]
        for line in prompts.read_text().splitlines()
    ]
    cut = truth.count("length")
    assert 0 < cut < len(truth), f"the tiny model should both stop and run out on these prompts: {truth}"
    report = run_regenerate(_params(prompts, tmp_path / "a.jsonl", server, model_dir), LocalContext(tmp_path))
    assert report.rejected["answer_cut_off"] == cut and report.rows_out == len(truth) - cut
    kept_lines = [r["source_ref"]["line"] for r in _rows(tmp_path / "a.jsonl")]
    assert kept_lines == [i + 1 for i, f in enumerate(truth) if f == "stop"]
    keep = _params(prompts, tmp_path / "b.jsonl", server, model_dir, keep_cut_off=True)
    report = run_regenerate(keep, LocalContext(tmp_path))
    assert report.rows_out == len(truth) and report.warnings["answer_cut_off"] == cut
    finishes = [r["generation"]["turns"][0]["finish_reason"] for r in _rows(tmp_path / "b.jsonl")]
    assert finishes == truth


def test_a_reasoning_target_cut_off_while_thinking_leaves_no_answer(
    server: str, model_dir: Path, tmp_path: Path
) -> None:
    # With thinking on, the tiny model never closes its think block: the server returns reasoning
    # only (reasoning_content) and no content, which must never be written as an answer.
    params = _params(_prompts(tmp_path, 6), tmp_path / "out.jsonl", server, model_dir, reasoning=True)
    with pytest.raises(JobFailed, match="no rows were written") as err:
        run_regenerate(params, LocalContext(tmp_path))
    report: Report = err.value.report  # type: ignore[assignment]
    assert report.rows_in == 6 and report.rows_rejected == 6
    assert set(report.rejected) <= {"empty_answer", "answer_cut_off"}
    if "empty_answer" in report.rejected:
        assert "only reasoning" in report.examples["empty_answer"][0].reason
    assert not (tmp_path / "out.jsonl").exists()


def test_multi_turn_answers_feed_back_and_the_local_backend_agrees(
    server: str, model_dir: Path, tmp_path: Path
) -> None:
    convs = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Tell me about {i}."},
                {"role": "assistant", "content": "OK."},
                {"role": "user", "content": "And then?"},
                {"role": "assistant", "content": "OK."},
            ]
        }
        for i in range(5)
    ] + [{"turns": ["hello", "more please"]}]
    data = _write(tmp_path / "chats.jsonl", convs)
    params = _params(data, tmp_path / "served.jsonl", server, model_dir, keep_cut_off=True)
    report = run_regenerate(params, LocalContext(tmp_path))
    assert report.rows_out == 6 and report.rows_in == 6
    # `transformers serve` refuses return_token_ids (HTTP 422): asked again without it, no row lost
    regen = report.extra["regenerate"]
    assert [ep["return_token_ids"] for ep in regen["endpoints"]] == [False]
    assert regen["answers"] == 12 and regen["answers_with_token_ids"] == 0
    served = _rows(tmp_path / "served.jsonl")
    for row in served:
        msgs = row["messages"]
        assert [m["role"] for m in msgs if m["role"] != "system"] == ["user", "assistant"] * 2
        assert all(m["content"] != "OK." for m in msgs if m["role"] == "assistant")
        # the second answer is the server's answer to a history holding the target's first answer
        second = _raw(server, model_dir, [{k: m[k] for k in ("role", "content")} for m in msgs[:-1]], 6)
        assert second["message"]["content"] == msgs[-1]["content"]
    local = RegenerateParams(
        **{**params.model_dump(), "endpoints": [], "model": None, "local": str(model_dir)}
    )
    local.out = str(tmp_path / "local.jsonl")
    run_regenerate(local, LocalContext(tmp_path))
    local_rows = _rows(tmp_path / "local.jsonl")
    # the local backend also records each answer's generated ids (and their vocabulary)
    assert all(m["token_ids"] for r in local_rows for m in r["messages"] if m["role"] == "assistant")
    assert all(r["generation"]["token_ids"]["vocab"].startswith("sha256:") for r in local_rows)
    without_ids = [
        [{k: v for k, v in m.items() if k != "token_ids"} for m in r["messages"]] for r in local_rows
    ]
    assert without_ids == [r["messages"] for r in served]


def _journal_lines(out: Path) -> int:
    path = journal_path(out)
    return max(0, path.read_bytes().count(b"\n") - 1) if path.exists() else 0


def _wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_resume_after_a_kill_writes_every_row_once_in_input_order(
    server: str, model_dir: Path, tmp_path: Path
) -> None:
    prompts = _prompts(tmp_path, 120)
    out = tmp_path / "out.jsonl"
    argv = [
        sys.executable, "-m", "draftdeck.cli", "regenerate", str(prompts),
        "--endpoint", server, "--model", str(model_dir), "--out", str(out),
        "--max-tokens", "6", "--no-reasoning", "--keep-cut-off", "--concurrency", "3",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, env=os.environ.copy())
    try:
        _wait_for(lambda: _journal_lines(out) >= 10, 120, "10 rows in the journal")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done_before = _journal_lines(out)
    assert not out.exists() and done_before < 120
    resumed = subprocess.run([*argv, "--report", str(tmp_path / "r.json")], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["regenerate"]["resumed_rows"] >= done_before >= 10
    rows = _rows(out)
    assert [r["source_ref"]["line"] for r in rows] == list(range(1, 121))
    assert not journal_path(out).exists()
    fresh = _params(prompts, tmp_path / "fresh.jsonl", server, model_dir, keep_cut_off=True, concurrency=8)
    run_regenerate(fresh, LocalContext(tmp_path))
    assert [r["messages"] for r in _rows(tmp_path / "fresh.jsonl")] == [r["messages"] for r in rows]


def test_server_killed_mid_job_retries_fails_clearly_then_resumes(model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    prompts = _prompts(tmp_path, 200)
    out = tmp_path / "out.jsonl"
    url = f"http://127.0.0.1:{port}"
    outcome: dict[str, Any] = {}

    def job(**kw: Any) -> threading.Thread:
        def target() -> None:
            try:
                outcome["report"] = run_regenerate(
                    _params(prompts, out, url, model_dir, **kw), LocalContext(tmp_path)
                )
            except Exception as exc:
                outcome["error"] = exc

        t = threading.Thread(target=target)
        t.start()
        return t

    # 1) the server dies and does not come back: retries, then a failure naming the endpoint
    with transformers_serve(model_dir, port) as (_, proc):
        t = job(retries=2, keep_cut_off=True, concurrency=2)
        _wait_for(lambda: _journal_lines(out) >= 5, 120, "5 rows in the journal")
        proc.kill()
        t.join(60)
    assert isinstance(outcome.get("error"), EndpointsDown), outcome
    assert url in str(outcome["error"]) and "after 3 tries" in str(outcome["error"])
    done = _journal_lines(out)
    assert 5 <= done < 200 and not out.exists()

    # 2) it dies again mid-resume and comes back within the retries: the job completes
    outcome.clear()
    with transformers_serve(model_dir, port) as (_, proc):
        t = job(retries=12, backoff_s=0.5, keep_cut_off=True, concurrency=2)
        _wait_for(lambda: _journal_lines(out) >= done + 5, 120, "5 more rows")
        proc.kill()
        proc.wait()
    with transformers_serve(model_dir, port):
        t.join(300)
    assert "error" not in outcome, outcome
    report: Report = outcome["report"]
    assert report.rows_out == 200 and report.extra["regenerate"]["resumed_rows"] >= done
    assert [r["source_ref"]["line"] for r in _rows(out)] == list(range(1, 201))
    assert any(ep["errors"] for ep in report.extra["regenerate"]["endpoints"])


def test_seed_prompts_padded_with_ok_become_the_targets_own_tokenized_answers(
    server: str, model_dir: Path, tmp_path: Path
) -> None:
    """The seeds' path: user-only prompts (padded with a dummy "OK." answer) -> regenerate -> tokenize:
    every trained token is the target's, and "OK." is nowhere."""
    from transformers import AutoTokenizer

    from draftdeck.convert import ConvertOptions, read_conversations
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_rows

    ok = {"role": "assistant", "content": "OK."}
    rows: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": f"Prompt {i}"}, ok]} for i in range(40)
    ]
    rows += [{"prompt": f"Plain prompt {i}"} for i in range(8)]
    data = _write(tmp_path / "seed.jsonl", rows)
    out = tmp_path / "regen.jsonl"
    report = run_regenerate(_params(data, out, server, model_dir, keep_cut_off=True), LocalContext(tmp_path))
    assert report.rows_out == 48 and report.rejected == {}
    # The random tiny target often answers with the same one or two tokens, which convert's placeholder
    # check rightly flags; it is switched off here, and "OK." is looked for directly below.
    convs = list(read_conversations([out], Report(), ConvertOptions(placeholder_max_chars=-1)))
    result = tokenize_rows(convs, TokenizeOptions(tokenizer=model_dir, encoder="hf", workers=1))
    assert result.report.rows_out == 48 and not result.report.rejected
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    for conv, shard_row in zip(convs, result.rows, strict=True):
        answer = conv.messages[-1].content
        trained = tok.decode(
            [int(t) for t, m in zip(shard_row.input_ids, shard_row.loss_mask, strict=True) if m]
        )
        assert answer and answer in trained and "OK." not in tok.decode(list(shard_row.input_ids))
