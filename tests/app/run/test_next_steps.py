"""The job pages' next steps, words and rates, through the real pipeline: a scan, the convert its page
offers, the tokenize the convert's page offers, the dataset that tokenize made (run in this process)."""

from __future__ import annotations

import html
import json
import re
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.web import form_token


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        c.get("/jobs")  # sets the CSRF cookie
        yield c


def _next_step(page: str, label: str) -> str:
    found = re.search(r'<nav class="next-steps"[^>]*>(.*?)</nav>', page, re.S)
    assert found, "no next step on the page"
    links = dict(
        (html.unescape(t), html.unescape(h)) for h, t in re.findall(r'href="([^"]+)">([^<]+)</a>', found[1])
    )
    assert label in links, links
    return links[label]


def _form_values(page: str) -> dict[str, str]:
    """What the New-job form shows: inputs, textareas and selected options, as the browser would post."""
    form = re.search(r'<form method="post" action="/jobs".*?</form>', page, re.S)
    assert form
    values: dict[str, str] = {}
    for name, text in re.findall(r'<textarea name="([^"]+)"[^>]*>(.*?)</textarea>', form[0], re.S):
        values[name] = html.unescape(text)
    for tag in re.findall(r"<input [^>]*>", form[0]):
        name, value = re.search(r'name="([^"]+)"', tag), re.search(r'value="([^"]*)"', tag)
        if name and value and ('type="checkbox"' not in tag or "checked" in tag):
            values[name[1]] = html.unescape(value[1])
    for name, options in re.findall(r'<select name="([^"]+)">(.*?)</select>', form[0], re.S):
        chosen = re.search(r'<option value="([^"]*)" selected', options)
        if chosen:
            values[name] = html.unescape(chosen[1])
    return {k: v for k, v in values.items() if v != ""}


def _start(client: TestClient, link: str, **more: str) -> int:
    form = _form_values(client.get(link).text)
    r = client.post("/jobs", data={**form, **more}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return int(r.headers["location"].rsplit("/", 1)[1])


def test_scan_convert_tokenize_each_page_offers_the_next(client: TestClient, migrated: Path) -> None:
    from app.run.job import run_job
    from draftdeck.chat.testing import small_bpe_tokenizer
    from tests.support.datasets import sample_conversations

    data = migrated / "data"
    src = data / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": c}) + "\n" for c in sample_conversations()))
    tok = data / "tok"
    shutil.copytree(small_bpe_tokenizer(), tok)
    csrf = form_token(client)

    scan = _start(client, "/jobs/new?kind=scan&inputs=" + str(src), csrf=csrf)
    assert run_job(scan) == "succeeded"
    link = _next_step(client.get(f"/jobs/{scan}").text, "Convert this")
    assert link.startswith("/jobs/new?kind=convert")
    assert _form_values(client.get(link).text)["inputs"] == str(src.resolve())  # prefilled

    convert = _start(client, link, csrf=csrf)
    assert run_job(convert) == "succeeded"
    link = _next_step(client.get(f"/jobs/{convert}").text, "Tokenize this")
    converted = _form_values(client.get(link).text)["inputs"]
    assert converted.startswith(str(migrated / "jobs" / str(convert))) and Path(converted).exists()

    tokenize = _start(client, link, csrf=csrf, tokenizer=str(tok))
    assert run_job(tokenize, in_process=True) == "succeeded"
    page = client.get(f"/jobs/{tokenize}").text
    [(ds_id, name)] = re.findall(r'href="/datasets/(\d+)">Open dataset ([^<]+)</a>', page)
    assert name == f"{Path(converted).name.split('.')[0]}-job{tokenize}"  # its input and job, not "dataset"
    assert "+1 more" not in page  # the tokenizer is a parameter, not a second input
    from app.store.db import session_scope
    from app.store.models import Job

    with session_scope() as s:
        tokenized = s.get(Job, tokenize)
        assert tokenized is not None and tokenized.result is not None
        result = tokenized.result
    assert result["tokens"] > result["trained_tokens"] > 0
    counts = dict(re.findall(r'data-count="(\w+)"><span class="num">([\d,]+)</span>', page))
    assert (
        counts["tokens"] == f"{result['tokens']:,}" and counts["trained"] == f"{result['trained_tokens']:,}"
    )
    assert "tokens/s" in page
    listing = client.get("/jobs").text
    row = re.search(rf'<tr data-job="{tokenize}".*?</tr>', listing, re.S)
    assert row and "more" not in row[0]
    assert client.get(f"/datasets/{ds_id}").status_code == 200


def _prompt_only_job(client: TestClient, migrated: Path, **form: str) -> tuple[int, Path, Path, str]:
    """A tokenize job started from the form on a prompt-only row, run here: it fails (on_missing is
    error by default). Returns (job id, prompts file, tokenizer folder, csrf token)."""
    from app.run.job import run_job
    from draftdeck.chat.testing import small_bpe_tokenizer

    data = migrated / "data"
    prompts = data / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    tok = data / "tok"
    shutil.copytree(small_bpe_tokenizer(), tok)
    csrf = form_token(client)
    job = _start(client, f"/jobs/new?kind=tokenize&inputs={prompts}", csrf=csrf, tokenizer=str(tok), **form)
    assert run_job(job, in_process=True) == "failed"
    return job, prompts, tok, csrf


def test_a_failed_job_says_what_to_change_in_the_form(client: TestClient, migrated: Path) -> None:
    """The core's message names a CLI flag; the page names the form field, and offers the form again
    with the job's parameters."""
    job, prompts, tok, _ = _prompt_only_job(client, migrated)
    page = client.get(f"/jobs/{job}").text
    error = html.unescape(re.search(r'id="job-error">(.*?)</div>', page, re.S)[1])  # type: ignore[index]
    assert "--on-missing" not in error and "set “on_missing” to drop in the form" in error
    again = _form_values(client.get(_next_step(page, "Change and start again")).text)
    assert again["inputs"] == str(prompts.resolve()) and again["tokenizer"] == str(tok.resolve())
    assert again["on_missing"] == "error"
    # the data decided this failure: a retry would repeat it, so the page offers the form, not Retry
    assert f'action="/jobs/{job}/retry"' not in page and 'id="job-no-retry"' in page


def test_only_failures_a_retry_can_change_offer_retry() -> None:
    from app.run.outcomes import retry_may_help
    from draftdeck.errors import InputError, crash_message

    assert retry_may_help("failed", crash_message(MemoryError("out of memory")))
    assert retry_may_help("failed", "chunk 3: " + crash_message(OSError("disk full")))
    assert retry_may_help("failed", "worker lost: no heartbeat for 120 s")
    assert retry_may_help("failed", "could not enqueue: Connection refused")
    assert retry_may_help("cancelled", "cancelled while running")
    assert not retry_may_help("failed", crash_message(InputError("data.jsonl: not found")))
    assert not retry_may_help("failed", "empty output: no rows were written out of 3 read")
    assert not retry_may_help("failed", "final step: too many rows rejected (internal error: x)")


def test_start_again_keeps_template_arguments_in_the_forms_syntax(client: TestClient, migrated: Path) -> None:
    """A failed job's template arguments come back as the form's KEY=VALUE lines (they came back as a
    JSON object, which the form refused on submit), and the form starts the same job again."""
    job, _, _, csrf = _prompt_only_job(
        client, migrated, template_kwargs="enable_thinking=false\nname=draft one"
    )
    link = _next_step(client.get(f"/jobs/{job}").text, "Change and start again")
    again = _form_values(client.get(link).text)
    assert again["template_kwargs"] == 'enable_thinking=false\nname="draft one"'
    second = _start(client, link, csrf=csrf)
    params = client.get(f"/api/jobs/{second}").json()["params"]
    assert params["template_kwargs"] == {"enable_thinking": False, "name": "draft one"}


def test_form_words_leave_unknown_flags_and_plain_text() -> None:
    from app.web.job_views import form_words

    assert form_words("use --strict to fail", "tokenize") == "tick “strict” in the form to fail"
    assert form_words("5 tokens > --seq-length 4", "tokenize") == "5 tokens > “seq_length” (in the form) 4"
    assert form_words("pass --nope x", "tokenize") == "pass --nope x"
    assert form_words("no flags here", "scan") == "no flags here"


def _running_job(done: int, total: int | None, unit: str, seconds: float) -> Any:
    from app.store.models import Job, JobStatus, utcnow

    started = utcnow() - timedelta(seconds=100)
    seen = started + timedelta(seconds=seconds)
    return Job(kind="scan", params={}, status=JobStatus.RUNNING, progress_done=done, progress_total=total,
               progress_unit=unit, started_at=started, heartbeat_at=seen)  # fmt: skip


@pytest.mark.parametrize(
    "done,total,unit,seconds,rate,eta",
    [
        (50, 200, "rows", 10, "5.0 rows/s", "about 30.0 s left"),
        (3 * 1024 * 1024, None, "bytes", 2, "1.5 MiB/s", None),
        (1, 30, "chunks", 60, "1.0 chunks/min", "about 29 min 0 s left"),
        (0, 10, "rows", 5, None, None),  # nothing done yet: no rate to give
    ],
)
def test_rates_and_time_left_come_from_counts_and_timestamps(
    done: int, total: int | None, unit: str, seconds: float, rate: str | None, eta: str | None
) -> None:
    from app.web.sse import progress_view

    view = progress_view(_running_job(done, total, unit, seconds))
    assert (view["rate"], view["eta"]) == (rate, eta)


def test_rates_show_on_the_job_page_and_the_jobs_list(client: TestClient, migrated: Path) -> None:
    from sqlmodel import col, update

    from app.store import records, state
    from app.store.db import session_scope
    from app.store.models import Job, JobStatus

    with session_scope() as s:
        job = records.create_job(s, "scan", {"inputs": [str(migrated / "data" / "x.jsonl")]}, "cpu")
        assert state.propose(s, job.id or 0, JobStatus.RUNNING, "test", worker="w:1").accepted
        got = records.get_job(s, job.id or 0)
        assert got is not None and got.started_at is not None
        started = got.started_at
        s.execute(update(Job).where(col(Job.id) == job.id).values(
            progress_done=400, progress_total=1000, progress_unit="rows",
            heartbeat_at=started + timedelta(seconds=4)))  # fmt: skip
        s.commit()
    for url in (f"/jobs/{job.id}", "/jobs"):
        page = client.get(url).text
        assert "100 rows/s · about 6.0 s left" in page, url


def test_a_chunked_tokenize_shows_rows_and_tokens_per_second(client: TestClient, migrated: Path) -> None:
    """Its progress unit is chunks; the rate is the finished chunks' rows and tokens over the time."""
    from sqlmodel import col, update

    from app.store import records, state
    from app.store.db import session_scope
    from app.store.models import ChunkStatus, Job, JobChunk, JobStatus

    with session_scope() as s:
        job = records.create_job(s, "tokenize", {"inputs": ["x"], "tokenizer": "t"}, "cpu")
        assert job.id is not None
        assert state.propose(s, job.id or 0, JobStatus.RUNNING, "test", worker="w:1").accepted
        got = records.get_job(s, job.id or 0)
        assert got is not None and got.started_at is not None
        started = got.started_at
        s.execute(update(Job).where(col(Job.id) == job.id).values(
            progress_done=1, progress_total=3, progress_unit="chunks",
            heartbeat_at=started + timedelta(seconds=10)))  # fmt: skip
        s.add(JobChunk(job_id=job.id, chunk_index=0, status=ChunkStatus.DONE, rows_out=30,
                       report={"tokens": 600}))  # fmt: skip
        s.add(JobChunk(job_id=job.id, chunk_index=1, status=ChunkStatus.RUNNING))
        s.commit()
    page = client.get(f"/jobs/{job.id}").text
    assert "3.0 rows/s · 60.0 tokens/s · about 20.0 s left" in page


def test_a_scan_that_would_keep_nothing_is_a_failed_scan(client: TestClient, migrated: Path) -> None:
    """A pre-flight saying "0 rows convert keeps" showed a big Convert this button: it is a failed scan
    now, its page saying what to fix and offering the form again, not the convert."""
    from app.run.job import run_job

    prompts = migrated / "data" / "only-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                               for i in range(3)))  # fmt: skip
    csrf = form_token(client)
    job = _start(client, f"/jobs/new?kind=scan&inputs={prompts}", csrf=csrf)
    assert run_job(job, in_process=True) == "failed"
    page = client.get(f"/jobs/{job}").text
    error = html.unescape(re.search(r'id="job-error">(.*?)</div>', page, re.S)[1])  # type: ignore[index]
    assert "convert would keep none of the 3 rows (3 no_assistant_turn)" in error
    assert "Convert this" not in page
    _next_step(page, "Change and start again")


def test_an_unreadable_file_s_proposed_mapping_carries_to_the_convert(
    client: TestClient, migrated: Path
) -> None:
    """A scan of rows no reader knows proposes a mapping and offers to scan with it; the scan that
    reads offers Convert this with the same mapping (a convert without it would fail)."""
    from app.run.job import run_job
    from app.store.db import session_scope
    from app.store.models import Job

    rows = migrated / "data" / "medical.jsonl"
    rows.write_text("".join(json.dumps({"Question": f"q{i}?", "Response": f"answer number {i}"}) + "\n"
                            for i in range(3)))  # fmt: skip
    csrf = form_token(client)
    job = _start(client, f"/jobs/new?kind=scan&inputs={rows}", csrf=csrf)
    assert run_job(job, in_process=True) == "failed"
    page = client.get(f"/jobs/{job}").text
    assert "--columns prompt=Question --columns response=Response" in html.unescape(page)
    mapped = _start(client, _next_step(page, "Scan with the proposed mapping"), csrf=csrf)
    assert run_job(mapped, in_process=True) == "succeeded"
    link = _next_step(client.get(f"/jobs/{mapped}").text, "Convert this")
    convert = _start(client, link, csrf=csrf)
    assert run_job(convert, in_process=True) == "succeeded"
    with session_scope() as s:
        done = s.get(Job, convert)
        assert done is not None and done.params["columns"] == {"prompt": "Question", "response": "Response"}
        assert done.result["rows_out"] == 3  # type: ignore[index]


def test_the_form_shows_essentials_first_and_opens_advanced_only_for_a_given_value(
    client: TestClient,
) -> None:
    from draftdeck.kinds import KINDS

    for kind in KINDS.values():  # a kind's essentials name its own fields
        assert set(kind.params.essentials) <= set(kind.params.model_fields), kind.name

    def advanced(query: str) -> tuple[bool, str]:
        page = client.get(f"/jobs/new?kind=convert{query}").text
        tag, rest = page.split('<details class="advanced" id="advanced"', 1)[1].split(">", 1)
        return "open" in tag, rest.split("</details>", 1)[0]

    opened, inside = advanced("")
    assert not opened and 'name="strict"' in inside and 'name="to"' not in inside
    assert "Max rejected" in inside and '<code class="param-name"' in inside  # words, and the name
    assert advanced("&max_rejected=0.5")[0] is False  # the default, as "Change and start again" sends it
    assert advanced("&max_rejected=0.2")[0] is True  # a value the user chose is never hidden
