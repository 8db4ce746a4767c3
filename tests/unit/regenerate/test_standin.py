"""Regeneration against a stand-in OpenAI-compatible server: reasoning fields, empty answers,
refused keys and unknown models (stop at once), 429 retries, timeouts, context errors, the CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from draftdeck.errors import JobFailed, UsageError
from draftdeck.jobs.context import LocalContext
from draftdeck.quality import Report
from draftdeck.regenerate import RegenerateParams, run_regenerate
from tests.support.regen_standin import StandIn, completion, standin


def _prompts(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "prompts.jsonl"
    text = "".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(n))
    if not path.exists() or path.read_text() != text:  # rewriting would change its fingerprint
        path.write_text(text)
    return path


def _run(tmp_path: Path, server: StandIn, n: int = 3, **kw: Any) -> tuple[Report, list[dict[str, Any]]]:
    params = RegenerateParams(
        inputs=[str(_prompts(tmp_path, n))],
        out=str(tmp_path / "out.jsonl"),
        endpoints=[server.url],
        model="m",
        backoff_s=0.01,
        **kw,
    )
    report = run_regenerate(params, LocalContext(tmp_path / "ctx"))
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    return report, rows


def test_reasoning_fields_stay_structured(tmp_path: Path) -> None:
    replies = [
        completion("four", reasoning_content="2+2 is 4"),
        completion("four", reasoning="2+2 is 4"),
        completion("<think>\n2+2 is 4\n</think>\n\nfour"),
    ]
    with standin(StandIn(lambda msgs, n: replies[int(msgs[-1]["content"].split()[-1])])) as server:
        report, rows = _run(tmp_path, server, concurrency=1)
    assert report.rows_out == 3
    for row in rows:
        assert row["messages"][-1] == {
            "role": "assistant",
            "content": "four",
            "reasoning_content": "2+2 is 4",
        }
    assert server.requests[0]["chat_template_kwargs"] == {"enable_thinking": True}


def test_empty_and_cut_off_answers_are_rejected_with_their_codes(tmp_path: Path) -> None:
    replies = [
        completion("fine"),
        completion(None, reasoning_content="thinking"),
        completion("half", "length"),
    ]
    with standin(StandIn(lambda msgs, n: replies[int(msgs[-1]["content"].split()[-1])])) as server:
        report, rows = _run(tmp_path, server, max_rejected=1)  # 2 of 3 rejected: past the default half
    assert report.rows_in == 3 and report.rows_out == 1
    assert dict(report.rejected) == {"empty_answer": 1, "answer_cut_off": 1}
    assert "2 of 3 rows rejected" in report.extra["losses"]["rejected"]["alert"]
    assert report.extra["regenerate"]["completion_tokens"] == 9  # rejected answers' tokens count too
    assert "finish_reason 'length'" in report.examples["answer_cut_off"][0].reason
    assert rows[0]["source_ref"]["line"] == 1 and rows[0]["generation"]["model"] == "m"


def test_reasoning_when_reasoning_is_off_is_rejected(tmp_path: Path) -> None:
    with standin(StandIn(lambda msgs, n: completion("<think>x</think>y" if n == 1 else "plain"))) as server:
        report, _ = _run(tmp_path, server, n=2, concurrency=1, reasoning=False)
    assert dict(report.rejected) == {"reasoning_in_content": 1} and report.rows_out == 1


def test_a_refused_key_stops_before_the_first_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with standin(StandIn(lambda msgs, n: completion(), key="right")) as server:
        monkeypatch.setenv("TEST_REGEN_KEY", "wrong")
        with pytest.raises(UsageError, match="refused the API key"):
            _run(tmp_path, server, api_key_env="TEST_REGEN_KEY", retries=5)
        assert server.model_lists == 1 and server.requests == []  # no retries, no row sent
        monkeypatch.setenv("TEST_REGEN_KEY", "right")
        report, _ = _run(tmp_path, server, api_key_env="TEST_REGEN_KEY")
    assert report.extra["regenerate"]["api_key_used"] is True
    assert "right" not in json.dumps(report.to_dict())


def test_an_unknown_model_stops_before_the_first_row(tmp_path: Path) -> None:
    with standin(StandIn(lambda msgs, n: completion(), models=["other"])) as server:
        with pytest.raises(UsageError, match=r"'m' is not served.*other"):
            _run(tmp_path, server, retries=5)
        assert server.requests == []


def test_429_is_retried_then_the_row_completes(tmp_path: Path) -> None:
    with standin(
        StandIn(lambda msgs, n: (429, {"error": "slow down"}) if n <= 2 else completion())
    ) as server:
        report, _ = _run(tmp_path, server, n=1, retries=3)
    assert report.rows_out == 1 and len(server.requests) == 3
    assert report.extra["regenerate"]["endpoints"][0]["errors"] == 2


def test_a_server_error_after_every_retry_rejects_the_row(tmp_path: Path) -> None:
    def answer(msgs: list[dict[str, Any]], n: int) -> tuple[int, Any]:
        return (500, "boom") if msgs[-1]["content"] == "question 0" else completion()

    with standin(StandIn(answer)) as server:
        report, rows = _run(tmp_path, server, n=2, retries=2, concurrency=1)
    assert (
        dict(report.rejected) == {"server_error": 1}
        and "after 3 tries" in report.examples["server_error"][0].reason
    )
    assert [r["source_ref"]["line"] for r in rows] == [2]


def test_a_slow_server_hits_the_timeout(tmp_path: Path) -> None:
    # The server answers after 30 s: two tries that wait for it take a minute, two that time out at
    # 0.2 s take about half a second, and the bound between them (10 s) no loaded machine reaches.
    # (Its handler threads are daemons: leaving the block does not wait for them.)
    with standin(StandIn(lambda msgs, n: completion(), delay_s=30.0)) as server:
        started = time.monotonic()
        with pytest.raises(JobFailed) as err:
            _run(tmp_path, server, n=1, timeout_s=0.2, retries=1)
    assert time.monotonic() - started < 10
    assert len(server.requests) == 2  # the first try and its retry, each given up on
    assert err.value.report.rejected["server_error"] == 1  # type: ignore[attr-defined]
    assert "timed out after 0.2s" in err.value.report.examples["server_error"][0].reason  # type: ignore[attr-defined]


def test_most_rows_rejected_fails_the_job_by_default(tmp_path: Path) -> None:
    replies = [completion("fine"), completion(None), completion(None)]
    server = StandIn(lambda msgs, n: replies[int(msgs[-1]["content"].split()[-1])])
    with standin(server) as running, pytest.raises(JobFailed, match=r"2 of 3 rows rejected \(66.7%\)"):
        _run(tmp_path, running)


def test_context_window_errors_and_malformed_answers_have_their_codes(tmp_path: Path) -> None:
    replies = [
        (400, {"message": "This model's maximum context length is 32 tokens. However, you requested 99"}),
        (200, {"choices": [{"text": "a legacy completion"}]}),
        (200, "not json"),
        completion("kept"),
    ]
    with standin(StandIn(lambda msgs, n: replies[int(msgs[-1]["content"].split()[-1])])) as server:
        report, rows = _run(tmp_path, server, n=4, max_rejected=1)
    assert dict(report.rejected) == {"prompt_too_long": 1, "malformed_answer": 2}
    assert len(rows) == 1 and rows[0]["messages"][-1]["content"] == "kept"


def _cli() -> typer.Typer:
    from draftdeck.cli import make_app

    return make_app()


def test_cli_exit_codes(tmp_path: Path) -> None:
    prompts = _prompts(tmp_path, 2)
    out = tmp_path / "out.jsonl"
    runner = CliRunner()
    with standin(StandIn(lambda msgs, n: completion("hi"), key="k")) as server:
        base = ["regenerate", str(prompts), "--endpoint", server.url, "--model", "m", "--out", str(out)]
        key = {"OPENAI_API_KEY": "k"}
        ok = runner.invoke(_cli(), [*base, "--report", str(tmp_path / "r.json")], env=key)
        assert ok.exit_code == 0, ok.output
        assert json.loads((tmp_path / "r.json").read_text())["rows_out"] == 2
        assert "token ids kept for 0 of 2 answers" in ok.output  # the stand-in returns none
        refused = runner.invoke(_cli(), base, env={"OPENAI_API_KEY": "bad"})
        assert refused.exit_code == 2 and "refused the API key" in refused.output
    both = runner.invoke(
        _cli(), ["regenerate", str(prompts), "--out", str(out), "--local", "x", "--endpoint", "http://y"]
    )
    assert both.exit_code == 2
    with standin(StandIn(lambda msgs, n: completion(""))) as server:
        empty = runner.invoke(
            _cli(),
            [
                "regenerate",
                str(prompts),
                "--endpoint",
                server.url,
                "--model",
                "m",
                "--out",
                str(tmp_path / "e.jsonl"),
            ],
        )
    assert empty.exit_code == 1 and "no rows were written" in empty.output


def test_endpoints_take_turns_and_report_their_health(tmp_path: Path) -> None:
    with (
        standin(StandIn(lambda msgs, n: completion("a"))) as one,
        standin(StandIn(lambda msgs, n: completion("b"))) as two,
    ):
        params = RegenerateParams(
            inputs=[str(_prompts(tmp_path, 6))],
            out=str(tmp_path / "out.jsonl"),
            endpoints=[one.url, two.url],
            model="m",
            concurrency=1,
        )
        report = run_regenerate(params, LocalContext(tmp_path / "ctx"))
    assert len(one.requests) == len(two.requests) == 3
    assert [ep["ok"] for ep in report.extra["regenerate"]["endpoints"]] == [3, 3]


def test_tool_calls_are_checked_and_tool_results_follow_the_targets_calls(tmp_path: Path) -> None:
    call = {"id": "t1", "type": "function", "function": {"name": "get", "arguments": '{"c": "Paris"}'}}
    bad = {"id": "t2", "type": "function", "function": {"name": "get", "arguments": "{not json"}}
    conv: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{**call, "id": "src1"}]},
            {"role": "tool", "content": "sunny", "tool_call_id": "src1"},
            {"role": "assistant", "content": "Sunny."},
        ],
        "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
    }
    data = tmp_path / "tools.jsonl"
    data.write_text(json.dumps(conv) + "\n" + json.dumps({**conv, "messages": conv["messages"][:1]}) + "\n")

    def answer(msgs: list[dict[str, Any]], n: int) -> tuple[int, Any]:
        if msgs[-1]["role"] == "tool":
            return completion("It is sunny.")
        return completion(None, "tool_calls", tool_calls=[call if n == 1 else bad])

    with standin(StandIn(answer)) as server:
        params = RegenerateParams(
            inputs=[str(data)],
            out=str(tmp_path / "out.jsonl"),
            endpoints=[server.url],
            model="m",
            concurrency=1,
        )
        report = run_regenerate(params, LocalContext(tmp_path / "ctx"))
    assert dict(report.rejected) == {"invalid_tool_call": 1} and report.rows_out == 1
    assert server.requests[0]["tools"] == conv["tools"]
    msgs = json.loads((tmp_path / "out.jsonl").read_text())["messages"]
    assert (
        msgs[1]["tool_calls"][0]["id"] == "t1" and msgs[2]["tool_call_id"] == "t1"
    )  # mapped to the target's id
    assert msgs[3]["content"] == "It is sunny."


def test_cancel_stops_promptly_and_a_rerun_resumes(tmp_path: Path) -> None:
    import threading

    from draftdeck.errors import Cancelled

    # Each answer takes 0.5 s: the 26 or so rows left at the cancel would take 6.5 s two at a time, the
    # requests in flight end within 0.5 s, and the bound between them (5 s) no loaded machine reaches.
    with standin(StandIn(lambda msgs, n: completion("x"), delay_s=0.5)) as server:
        params = RegenerateParams(
            inputs=[str(_prompts(tmp_path, 30))], out=str(tmp_path / "out.jsonl"), endpoints=[server.url],
            model="m", concurrency=2,
        )  # fmt: skip
        ctx = LocalContext(tmp_path / "ctx")
        cancelled_at: list[float] = []

        def cancel_once_two_were_answered() -> None:
            # on the requests, not a fixed delay: on a busy machine 0.3 s could pass before the first.
            # Two at a time: a 4th request is sent once the first two were answered
            while len(server.requests) < 4:
                time.sleep(0.01)
            cancelled_at.append(time.monotonic())
            ctx.cancel()

        threading.Thread(target=cancel_once_two_were_answered, daemon=True).start()
        with pytest.raises(Cancelled):
            run_regenerate(params, ctx)
        assert time.monotonic() - cancelled_at[0] < 5
        sent = len(server.requests)
        assert 4 <= sent < 30
        server.delay_s = 0.0  # the rerun's pace is not what is checked
        report = run_regenerate(params, LocalContext(tmp_path / "ctx"))
    assert report.extra["regenerate"]["resumed_rows"] >= 2 and report.rows_out == 30
    assert [
        json.loads(line)["source_ref"]["line"] for line in (tmp_path / "out.jsonl").read_text().splitlines()
    ] == list(range(1, 31))


def _rows_file(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run_on(tmp_path: Path, server: StandIn, src: Path, **kw: Any) -> Report:
    params = RegenerateParams(
        inputs=[str(src)], out=str(tmp_path / "out.jsonl"), endpoints=[server.url], model="m", **kw
    )
    return run_regenerate(params, LocalContext(tmp_path / "ctx"))


def test_answers_kept_cut_off_raise_the_truncated_alert(tmp_path: Path) -> None:
    replies = [completion("fine"), completion("half", "length"), completion("fine too")]
    with standin(StandIn(lambda msgs, n: replies[int(msgs[-1]["content"].split()[-1])])) as server:
        report, rows = _run(tmp_path, server, keep_cut_off=True)
    assert (report.rows_out, report.warnings["answer_cut_off"]) == (3, 1)
    assert rows[1]["messages"][-1]["content"] == "half"  # kept, as asked
    truncated = report.extra["losses"]["truncated"]
    assert (truncated["rows"], truncated["of"]) == (1, 3)
    assert truncated["alert"] == "1 of 3 rows truncated (33.3%), above the alert threshold 5%"
    with standin(StandIn(lambda msgs, n: replies[int(msgs[-1]["content"].split()[-1])])) as server:
        (tmp_path / "again").mkdir()
        report, _ = _run(tmp_path / "again", server, keep_cut_off=True, alert_truncated=0.5)
    assert "alert" not in report.extra["losses"]["truncated"]  # the job's own threshold


def test_duplicate_prompts_are_warned_and_raise_the_duplicated_alert(tmp_path: Path) -> None:
    """Kept by default, as convert keeps them (sampled answers to one prompt may differ); counted."""
    src = _rows_file(tmp_path, [{"prompt": "same"}, {"prompt": "same"}, {"prompt": "other"}])
    with standin(StandIn(lambda msgs, n: completion("fine"))) as server:
        report = _run_on(tmp_path, server, src)
    assert (report.rows_in, report.rows_out, report.warnings["duplicate_conversation"]) == (3, 3, 1)
    assert report.extra["losses"]["duplicated"]["alert"].startswith("1 of 3 rows duplicated (33.3%)")
    (tmp_path / "again").mkdir()
    with standin(StandIn(lambda msgs, n: completion("fine"))) as server:
        report = _run_on(tmp_path / "again", server, src, alert_duplicated=0.5)
    assert "alert" not in report.extra["losses"]["duplicated"]  # the job's own threshold


def test_from_forces_one_input_shape(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"prompt": "a prompt row"},
        {"messages": [{"role": "user", "content": "an openai row"}]},
    ]
    src = _rows_file(tmp_path, rows)
    with standin(StandIn(lambda msgs, n: completion("fine"))) as server:
        report = _run_on(tmp_path, server, src, from_format="openai", max_rejected=1)
    assert (report.rows_out, dict(report.rejected)) == (1, {"format_mismatch": 1})
    assert report.examples["format_mismatch"][0].line == 1
    assert [r["messages"][0]["content"] for r in server.requests] == ["an openai row"]
