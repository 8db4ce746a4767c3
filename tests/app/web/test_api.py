"""The JSON API and page security on the embedded stack (no worker needed: jobs stay queued)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.support.web import form_token


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def _file(home: Path, name: str = "a.jsonl") -> Path:
    path = home / "data" / name
    # a row convert keeps: a scan of it passes (one that would keep nothing fails)
    path.write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    )
    return path


def test_submit_list_show_cancel(client: TestClient, migrated: Path) -> None:
    _file(migrated)
    r = client.post("/api/jobs", json={"kind": "scan", "params": {"inputs": "data/a.jsonl"}})
    assert r.status_code == 201
    job_id = r.json()["id"]
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["status"] == "queued" and job["params"]["inputs"] == [
        str((migrated / "data" / "a.jsonl").resolve())
    ]
    assert job["events"][0]["message"] == "queued on cpu"
    assert [j["id"] for j in client.get("/api/jobs").json()] == [job_id]
    assert client.post(f"/api/jobs/{job_id}/cancel", json={}).json()["status"] == "cancelled"
    retry = client.post(f"/api/jobs/{job_id}/retry", json={})
    assert retry.status_code == 201 and retry.json()["id"] != job_id
    assert client.post(f"/api/jobs/{retry.json()['id']}/retry", json={}).status_code == 409


@pytest.mark.parametrize(
    "body,message",
    [
        ({"kind": "nope", "params": {}}, "unknown job kind 'nope'"),
        ({"kind": "scan", "params": {}}, "inputs: Field required"),
        ({"kind": "scan", "params": {"path": "data/a.jsonl"}}, "path: Extra inputs"),  # the old name
        (
            {"kind": "scan", "params": {"inputs": "data/a.jsonl", "max_row_bytes": 10**30}},
            "less than or equal",
        ),
        ({"kind": "scan", "params": {"inputs": ["data/a.jsonl"] * 10_001}}, "at most 10000 items"),
        ({"kind": "scan", "params": {"inputs": "data/a\x00.jsonl"}}, "NUL byte"),
        (
            {"kind": "tokenize", "params": {"inputs": "data/a.jsonl", "tokenizer": "t", "workers": 4}},
            "workers: Extra inputs",
        ),
        ({"kind": "convert", "params": {"inputs": "data/a.jsonl", "out": "data/a.jsonl"}}, "is the input"),
        ({"kind": "convert", "params": {"inputs": "data/a.jsonl", "out": "data"}}, "existing folder"),
        ({"kind": "scan", "params": {"inputs": "/etc/passwd"}}, "outside the data roots"),
        ({"kind": "scan", "params": {"inputs": "../../../../etc/passwd"}}, "outside the data roots"),
        ({"kind": "scan", "params": {"inputs": "data/missing.jsonl"}}, "no such file"),
        ({"kind": "scan", "params": {"inputs": "data/a.jsonl", "colour": 1}}, "colour: Extra inputs"),
        (
            {"kind": "convert", "params": {"inputs": "data/a.jsonl", "maxrejected": 0.2}},
            "maxrejected: Extra inputs are not permitted (did you mean max_rejected?)",
        ),
    ],
)
def test_bad_submissions_are_400_with_a_reason(
    client: TestClient, migrated: Path, body: dict, message: str
) -> None:
    _file(migrated)
    r = client.post("/api/jobs", json=body)
    assert r.status_code == 400 and message in r.json()["detail"]


def test_unknown_job_is_404(client: TestClient) -> None:
    assert client.get("/api/jobs/999").status_code == 404
    assert client.post("/api/jobs/999/cancel", json={}).status_code == 404


def test_api_writes_must_be_json(client: TestClient, migrated: Path) -> None:
    _file(migrated)
    r = client.post(
        "/api/jobs", data={"kind": "scan"}, headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 415


def test_token_required_beyond_loopback(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.settings import get_settings
    from app.web.main import create_app

    monkeypatch.setenv("DRAFTDECK_HOST", "0.0.0.0")
    monkeypatch.setenv("DRAFTDECK_TOKEN", "s3cret")
    get_settings.cache_clear()
    _file(migrated)
    with TestClient(create_app()) as c:
        body = {"kind": "scan", "params": {"inputs": "data/a.jsonl"}}
        assert c.post("/api/jobs", json=body).status_code == 401
        assert c.post("/api/jobs", json=body, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/api/jobs", json=body, headers={"authorization": "Bearer s3cret"}).status_code == 201
        assert c.get("/api/jobs").status_code == 401  # beyond loopback, reads need it too
        assert c.get("/api/jobs", headers={"authorization": "Bearer s3cret"}).status_code == 200


def test_refuses_to_listen_beyond_loopback_without_a_token() -> None:
    with pytest.raises(SystemExit, match="without DRAFTDECK_TOKEN"):
        Settings(token=None).check_listen("0.0.0.0")
    Settings(token=None).check_listen("127.0.0.1")
    Settings(token=None).check_listen("::1")
    Settings(token="t").check_listen("0.0.0.0")


def test_forms_need_the_csrf_token(client: TestClient, migrated: Path) -> None:
    _file(migrated)
    page = client.get("/jobs/new")
    assert page.status_code == 200
    csrf = form_token(client)
    assert csrf and f'value="{csrf}"' in page.text
    form = {"kind": "scan", "inputs": "data/a.jsonl"}
    assert client.post("/jobs", data=form).status_code == 403
    assert client.post("/jobs", data={**form, "csrf": "forged"}).status_code == 403
    r = client.post("/jobs", data={**form, "csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/jobs/")


def test_form_errors_are_shown_escaped(client: TestClient, migrated: Path) -> None:
    client.get("/jobs/new")
    csrf = form_token(client)
    r = client.post("/jobs", data={"kind": "scan", "inputs": "<script>alert(1)</script>", "csrf": csrf})
    assert r.status_code == 400
    assert "<script>alert(1)</script>" not in r.text and "&lt;script&gt;" in r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]


def test_a_refused_form_value_is_kept_and_its_field_marked(client: TestClient, migrated: Path) -> None:
    _file(migrated)
    client.get("/jobs/new?kind=convert")
    csrf = form_token(client)
    form = {"kind": "convert", "inputs": "data/a.jsonl", "max_rejected": "2", "csrf": csrf}
    r = client.post("/jobs", data=form)
    assert r.status_code == 400
    field = r.text.split('name="max_rejected"')[0].rsplit("<label", 1)[1]
    assert "field-invalid" in field  # the refused field is marked ...
    after = r.text.split('name="max_rejected"')[1]
    assert after.split(">")[0].strip().startswith('value="2"')  # ... keeps what was typed ...
    assert (
        'id="error-max_rejected" role="alert">Input should be less than or equal to 1<' in after
    )  # ... and says why
    assert r.text.count("field-invalid") == 1


def test_pages_render(client: TestClient, migrated: Path) -> None:
    _file(migrated)
    job_id = client.post("/api/jobs", json={"kind": "scan", "params": {"inputs": "data/a.jsonl"}}).json()[
        "id"
    ]
    for url in (
        "/jobs",
        "/jobs/table",
        "/jobs/new",
        f"/jobs/{job_id}",
        f"/jobs/{job_id}/live",
        "/alerts",
        "/login",
    ):
        assert client.get(url).status_code == 200, url
    assert client.get("/jobs/12345").status_code == 404
    page = client.get(f"/jobs/{job_id}").text
    assert f'data-sse="/jobs/{job_id}/events?log=' in page  # queued: the page listens to its stream
    assert "hx-trigger" not in page  # and polls nothing
    client.post(f"/api/jobs/{job_id}/cancel", json={})
    assert "data-sse" not in client.get(f"/jobs/{job_id}").text  # ended: nothing to listen to


def test_a_convert_out_that_is_a_data_root_is_refused(client: TestClient, migrated: Path) -> None:
    _file(migrated)
    body = {"kind": "convert", "params": {"inputs": "data/a.jsonl", "out": str(migrated)}}
    r = client.post("/api/jobs", json=body)
    assert r.status_code == 400 and "is a data root" in r.json()["detail"]


def test_sweeper_fails_jobs_without_heartbeat(migrated: Path) -> None:
    from app.run.sweeper import mark_lost_jobs
    from app.store import records, state
    from app.store.db import session_scope
    from app.store.models import JobStatus

    with session_scope() as s:
        stale = records.create_job(s, "scan", {"inputs": ["x"]}, "cpu")
        fresh = records.create_job(s, "scan", {"inputs": ["y"]}, "cpu")
        assert stale.id is not None and fresh.id is not None
        assert state.propose(s, stale.id, JobStatus.RUNNING, "test", worker="w:1").accepted
        from sqlalchemy import update
        from sqlmodel import col

        from app.store.models import Job, utcnow

        s.execute(
            update(Job).where(col(Job.id) == stale.id).values(heartbeat_at=utcnow() - timedelta(seconds=120))
        )
        s.commit()
        assert state.propose(s, fresh.id, JobStatus.RUNNING, "test", worker="w:2").accepted
        assert mark_lost_jobs(s, lost_after_seconds=60) == [stale.id]
        lost, running = records.get_job(s, stale.id), records.get_job(s, fresh.id)
        assert lost is not None and lost.error is not None and running is not None
        assert lost.error.startswith("worker lost")
        assert running.status == JobStatus.RUNNING
        # a terminal job cannot be moved again: the rules refuse, naming the current status
        decision = state.propose(s, stale.id, JobStatus.SUCCEEDED, "late")
        assert not decision.accepted and decision.status == JobStatus.FAILED
        assert mark_lost_jobs(s, lost_after_seconds=60) == []


def test_redelivered_message_does_not_run_a_job_twice(migrated: Path) -> None:
    from app.run.job import run_job
    from app.store import records
    from app.store.db import session_scope
    from app.store.models import JobStatus

    path = _file(migrated)
    with session_scope() as s:
        job = records.create_job(s, "scan", {"inputs": [str(path)]}, "cpu")
    assert job.id is not None
    assert run_job(job.id) == JobStatus.SUCCEEDED
    assert run_job(job.id) == "skipped:succeeded"
    with session_scope() as s:
        from sqlmodel import select

        from app.store.models import JobOutput

        assert len(s.exec(select(JobOutput).where(JobOutput.job_id == job.id)).all()) == 1


@pytest.fixture
def server_folder(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The server started from the folder above its home, with the default roots: ./data and the
    home (`home`, standing for `var`)."""
    from app.settings import get_settings

    folder = migrated.parent
    (folder / "data").mkdir()
    (folder / "data" / "a.jsonl").write_text('{"messages": []}\n')
    monkeypatch.chdir(folder)
    monkeypatch.delenv("DRAFTDECK_DATA_ROOTS")
    get_settings.cache_clear()
    assert get_settings().roots == [(folder / "data").resolve(), migrated.resolve()]
    return folder.resolve()


@pytest.mark.parametrize(
    "out,where",
    [
        ("data/ui_train.jsonl", "data/ui_train.jsonl"),  # was data/data/ui_train.jsonl
        ("home/datasets/big.jsonl", "home/datasets/big.jsonl"),  # a root by its name: was data/home/...
        ("ui_train.jsonl", "data/ui_train.jsonl"),  # outside every root from the cwd: the first root
    ],
)
def test_a_relative_out_means_one_place_on_the_form_and_the_api(
    client: TestClient, server_folder: Path, out: str, where: str
) -> None:
    body = {"kind": "convert", "params": {"inputs": "data/a.jsonl", "to": "openai", "out": out}}
    r = client.post("/api/jobs", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["params"]["out"] == str(server_folder / where)  # the answer says where it will go
    client.get("/jobs/new?kind=convert")
    form = {"kind": "convert", "inputs": "data/a.jsonl", "to": "openai", "out": out}
    r = client.post("/jobs", data={**form, "csrf": form_token(client)}, follow_redirects=False)
    assert r.status_code == 303, r.text
    job = client.get(f"/api/jobs/{r.headers['location'].rsplit('/', 1)[1]}").json()
    assert job["params"]["out"] == str(server_folder / where)
    assert job["params"]["inputs"] == [str(server_folder / "data" / "a.jsonl")]


def test_an_input_and_an_output_typed_alike_are_one_file(client: TestClient, server_folder: Path) -> None:
    """Inputs follow the same rule as outputs, so `a.jsonl` and `data/a.jsonl` are the same file, and
    a relative input is never looked for in a second root."""
    (server_folder / "home" / "only_in_home.jsonl").write_text('{"messages": []}\n')
    ok = client.post("/api/jobs", json={"kind": "scan", "params": {"inputs": "a.jsonl"}})
    assert ok.json()["params"]["inputs"] == [str(server_folder / "data" / "a.jsonl")]
    r = client.post("/api/jobs", json={"kind": "scan", "params": {"inputs": "only_in_home.jsonl"}})
    assert r.status_code == 400
    assert str(server_folder / "data" / "only_in_home.jsonl") in r.json()["detail"]  # where it looked
    r = client.post("/api/jobs", json={"kind": "scan", "params": {"inputs": "home/only_in_home.jsonl"}})
    assert r.status_code == 201


def test_an_optional_choice_starts_unset_in_the_form(client: TestClient, migrated: Path) -> None:
    """`from_format` has no default: the form's select must not submit its first shape unasked (it did,
    and every row not of that shape was rejected as format_mismatch)."""
    import re

    _file(migrated)
    page = client.get("/jobs/new", params={"kind": "scan"}).text
    select = re.search(r'<select name="from_format">(.*?)</select>', page, re.S)
    assert select is not None
    first = re.search(r"<option ([^>]*)>", select.group(1))
    assert first is not None and 'value=""' in first.group(1) and "selected" in first.group(1)
    csrf = form_token(client)
    for given, stored in (("", None), ("sharegpt", "sharegpt")):
        form = {"kind": "scan", "inputs": "data/a.jsonl", "from_format": given, "csrf": csrf}
        r = client.post("/jobs", data=form, follow_redirects=False)
        assert r.status_code == 303, r.text
        job_id = int(r.headers["location"].rsplit("/", 1)[1])
        assert client.get(f"/api/jobs/{job_id}").json()["params"].get("from_format") == stored
