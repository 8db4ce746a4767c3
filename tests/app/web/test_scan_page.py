"""The scan page of a file its reader took by the wrong fields (issue 49): a short `question` / `answer`
pair beside the long `Question` / `Complex_CoT` / `Response`. The page proposes the mapping that reads
the long text and offers it in one click, not a plain Convert; the convert it offers keeps every row
with its reasoning."""

from __future__ import annotations

import html
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from fastapi.testclient import TestClient

from tests.conftest import FIXTURES
from tests.support.web import form_token

MEDICAL_PAIRS = FIXTURES / "formats" / "medical_reasoning_pairs.jsonl"


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def _next_steps(page: str) -> dict[str, str]:
    found = re.search(r'<nav class="next-steps"[^>]*>(.*?)</nav>', page, re.S)
    assert found, "no next step on the page"
    links = re.findall(r'href="([^"]+)">([^<]+)</a>', found[1])
    return {html.unescape(label): html.unescape(href) for href, label in links}


def _start(client: TestClient, kind: str, link: str, csrf: str) -> int:
    """Post the New-job form `link` opens as its fields stand (the prefilled values)."""
    form = client.get(link).text
    body = re.search(r'<form method="post" action="/jobs".*?</form>', form, re.S)
    assert body
    fields = {
        n: html.unescape(v)
        for n, v in re.findall(r'<textarea name="([^"]+)"[^>]*>(.*?)</textarea>', body[0], re.S)
    }
    r = client.post("/jobs", data={"kind": kind, **{k: v for k, v in fields.items() if v}, "csrf": csrf},
                    follow_redirects=False)  # fmt: skip
    assert r.status_code == 303, r.text
    return int(r.headers["location"].rsplit("/", 1)[1])


def test_a_file_read_by_the_wrong_fields_gets_the_mapping_in_one_click(
    client: TestClient, migrated: Path
) -> None:
    from app.run.job import run_job
    from app.store.db import session_scope
    from app.store.models import Job

    data = migrated / "data" / MEDICAL_PAIRS.name
    shutil.copy(MEDICAL_PAIRS, data)
    csrf = form_token(client)
    scan = _start(client, "scan", f"/jobs/new?kind=scan&inputs={data}", csrf)
    assert run_job(scan, in_process=True) == "succeeded"
    page = client.get(f"/jobs/{scan}").text
    notice = re.search(r'<div class="notice notice-warn" id="suggested-mapping"[^>]*>(.*?)</div>', page, re.S)
    assert notice, "the page proposes no mapping"
    text = html.unescape(re.sub(r"<[^>]+>", "", notice[1]))
    assert "Read by the wrong fields" in text and "Complex_CoT, Question" in text
    assert "--columns prompt=Question --columns reasoning=Complex_CoT --columns response=Response" in text
    steps = _next_steps(page)
    assert list(steps) == ["Convert with the proposed mapping", "Scan with the proposed mapping"]
    convert = _start(client, "convert", steps["Convert with the proposed mapping"], csrf)
    assert run_job(convert, in_process=True) == "succeeded"
    with session_scope() as s:
        done = s.get(Job, convert)
        assert done is not None and done.result is not None
        assert done.params["columns"] == {
            "prompt": "Question",
            "reasoning": "Complex_CoT",
            "response": "Response",
        }
        assert (done.result["rows_out"], done.result["warnings"]) == (6, {})
        [out] = [Path(o["path"]) for o in done.result["outputs"]]
    rows = [orjson.loads(line) for line in MEDICAL_PAIRS.read_bytes().splitlines()]
    written = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [w["conversations"][0]["value"] for w in written] == [r["Question"] for r in rows]


def test_a_session_log_s_merged_lines_are_merged_in_the_result_and_on_the_page(
    client: TestClient, migrated: Path
) -> None:
    """The job's JSON result gives the merged lines apart from the rejected ones, as its page does."""
    from app.run.job import run_job
    from app.store.db import session_scope
    from app.store.models import Job

    data = migrated / "data" / "session.jsonl"
    shutil.copy(FIXTURES / "agents" / "session.jsonl", data)
    scan = _start(client, "scan", f"/jobs/new?kind=scan&inputs={data}", form_token(client))
    assert run_job(scan, in_process=True) == "succeeded"
    with session_scope() as s:
        job = s.get(Job, scan)
        assert job is not None and job.result is not None
        result = job.result
    assert (result["rejected"], result["merged"]) == (
        {"abandoned_branch": 1}, {"merged_event": 12, "session_metadata": 3})  # fmt: skip
    assert [i["code"] for i in result["would_reject"]] == ["abandoned_branch"]
    assert [i["code"] for i in result["would_merge"]] == ["merged_event", "session_metadata"]
    page = client.get(f"/jobs/{scan}").text
    counts = dict(re.findall(r'data-count="([a-z-]+)"[^>]*><span class="num">([^<]+)</span>', page))
    assert (counts["in"], counts["out"], counts["rejected"], counts["merged"]) == ("18", "2", "1", "15")
    for table, codes in (
        ("scan-would-reject", ["abandoned_branch"]),
        ("scan-merged", ["merged_event", "session_metadata"]),
    ):
        body = re.search(rf'<table id="{table}">(.*?)</table>', page, re.S)
        assert body and re.findall(r"<code>([a-z_]+)</code>", body[1]) == codes, table
