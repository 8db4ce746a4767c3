"""`draftdeck jobs ...` is a client of a real running server's JSON API; the in-process commands take
any path the user can read; `up` refuses a public address without a token."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from tests.conftest import REPO_ROOT

runner = CliRunner()
TOKEN = "s3cret-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The app served by uvicorn on a free loopback port, in a thread; a token is required."""
    import uvicorn

    from app.settings import get_settings

    monkeypatch.setenv("DRAFTDECK_TOKEN", TOKEN)
    get_settings.cache_clear()
    from app.web.main import app as web

    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    monkeypatch.setenv("DRAFTDECK_SERVER", f"http://127.0.0.1:{port}")
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


def test_jobs_commands_round_trip_over_http(server: str, migrated: Path) -> None:
    (migrated / "data" / "a.jsonl").write_text('{"messages": []}\n')
    (migrated / "data" / "b.jsonl").write_text('{"messages": []}\n')
    r = runner.invoke(
        app, ["jobs", "submit", "scan", "-p", "inputs=data/a.jsonl", "-p", "inputs=data/b.jsonl"]
    )
    assert r.exit_code == 0, r.output
    job_id = int(r.stdout.strip())  # stdout: the id alone (stderr: the resolved parameters)
    listed = runner.invoke(app, ["jobs", "list", "--server", server])
    assert listed.exit_code == 0 and "scan" in listed.output and "queued" in listed.output
    shown = runner.invoke(app, ["jobs", "show", str(job_id), "--json"])
    inputs = json.loads(shown.output)["params"]["inputs"]
    assert [Path(p).name for p in inputs] == ["a.jsonl", "b.jsonl"]  # resolved by the server
    from app.store import records
    from app.store.db import session_scope

    with session_scope() as session:  # what a run raises while it goes on (the truth pre-flight)
        records.raise_alert(
            session, "data_not_target_output", "0 of 2 rows were answered by this target", job_id=job_id
        )
    shown = runner.invoke(app, ["jobs", "show", str(job_id)])
    said = " ".join(shown.output.split())
    assert "alert data_not_target_output: 0 of 2 rows were answered by this target" in said
    assert said.startswith(f"job {job_id} scan: queued (created ") and "┃" not in said  # a line, no table
    cancelled = runner.invoke(app, ["jobs", "cancel", str(job_id)])
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output
    again = runner.invoke(app, ["jobs", "cancel", str(job_id)])
    assert again.exit_code == 2 and "only queued or running" in " ".join(again.output.split())
    retried = runner.invoke(app, ["jobs", "retry", str(job_id)])
    assert retried.exit_code == 0 and int(retried.output.strip()) != job_id
    twice = runner.invoke(app, ["jobs", "retry", str(job_id)])
    assert (
        twice.exit_code == 2 and "409" in twice.output and "already retried" in " ".join(twice.output.split())
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["jobs", "submit", "scan", "-p", "inputs=/etc/passwd"],
            "outside the data roots",
        ),  # the server's sandbox
        (["jobs", "submit", "scan", "--param", "nokeyvalue"], "KEY=VALUE"),
        (["jobs", "submit", "teleport"], "unknown job kind"),
        (["jobs", "show", "999"], "no job 999"),
        (
            ["jobs", "submit", "convert", "-p", "inputs=data/a.jsonl", "-p", "maxrejected=0.2"],
            "did you mean max_rejected?",
        ),
    ],
)
def test_usage_errors_exit_2(server: str, args: list[str], message: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())


def test_the_token_comes_from_the_environment(
    server: str, migrated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (migrated / "data" / "a.jsonl").write_text('{"messages": []}\n')
    monkeypatch.setenv("DRAFTDECK_TOKEN", "wrong")
    r = runner.invoke(app, ["jobs", "submit", "scan", "-p", "inputs=data/a.jsonl"])
    assert r.exit_code == 2 and "401" in r.output
    monkeypatch.delenv("DRAFTDECK_TOKEN")
    assert runner.invoke(app, ["jobs", "submit", "scan", "-p", "inputs=data/a.jsonl"]).exit_code == 2
    monkeypatch.setenv("DRAFTDECK_TOKEN", TOKEN)
    assert runner.invoke(app, ["jobs", "submit", "scan", "-p", "inputs=data/a.jsonl"]).exit_code == 0


def test_an_unreachable_server_is_a_clear_error(dd_home: Path) -> None:
    r = runner.invoke(app, ["jobs", "list", "--server", f"http://127.0.0.1:{_free_port()}"])
    assert r.exit_code == 2 and "cannot reach the DraftDeck server" in " ".join(r.output.split())


def test_scan_reads_any_readable_file_and_sets_exit_codes(dd_home: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "good.jsonl"  # outside the data roots: fine for a local command
    outside.parent.mkdir()
    outside.write_text('{"messages": []}\nbroken\n')
    r = runner.invoke(app, ["scan", str(outside), "--report", str(tmp_path / "r.json")])
    # the parsed row is an empty conversation: convert would keep nothing, and the scan fails saying so
    assert r.exit_code == 1, r.output
    said = " ".join(r.output.split())
    assert "convert would keep none of the 2 rows (1 empty_conversation, 1 json_error); e.g." in said
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["rows_in"], report["rows_out"]) == (2, 0)
    assert report["rejected"] == {"json_error": 1, "empty_conversation": 1}
    outside.write_text(
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a."}]}\n'
    )
    assert runner.invoke(app, ["scan", str(outside)]).exit_code == 0  # one row kept: a scan that passes
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r = runner.invoke(app, ["scan", str(empty)])
    assert r.exit_code == 1 and "empty input" in " ".join(r.output.split())
    assert runner.invoke(app, ["scan", str(tmp_path / "missing.jsonl")]).exit_code == 2


def test_up_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DRAFTDECK_TOKEN"}
    env["DRAFTDECK_HOME"] = str(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "up", "--host", "0.0.0.0", "--port", "8799"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "without DRAFTDECK_TOKEN" in r.stderr + r.stdout


def _run_the_first_job() -> tuple[list[str], threading.Thread]:
    """A thread standing in for `draftdeck worker`: it runs the one job once it is queued; the list
    gets its outcome."""
    from sqlmodel import select

    from app.run.job import run_job
    from app.store.db import session_scope
    from app.store.models import Job

    ran: list[str] = []

    def worker() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with session_scope() as session:
                job_id = session.exec(select(Job.id)).first()
            if job_id is not None:
                ran.append(run_job(job_id))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    return ran, thread


def test_submit_wait_prints_a_scans_findings(server: str, migrated: Path) -> None:
    """`jobs submit scan --wait` prints what `draftdeck scan` prints (it said only "succeeded" and
    the report's path), shapes per file included."""
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
    (migrated / "data" / "a.jsonl").write_text(json.dumps(chat) + "\n")
    alpaca = {"instruction": "hi", "output": "hello you"}
    (migrated / "data" / "b.jsonl").write_text(json.dumps(alpaca) + "\n")
    ran, thread = _run_the_first_job()
    r = runner.invoke(
        app, ["jobs", "submit", "scan", "-p", "inputs=data/a.jsonl", "-p", "inputs=data/b.jsonl", "--wait"]
    )
    thread.join(timeout=30)
    assert ran == ["succeeded"] and r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "convert would keep 2 of 2 rows" in text
    shapes = "".join(text.split("shapes", 1)[1].split("convert would keep", 1)[0].split())  # paths fold
    assert re.search(r"openai│1│\S*/data/a\.jsonl", shapes) and re.search(
        r"alpaca│1│\S*/data/b\.jsonl", shapes
    )
    assert "scan-report.json " in text and "row" not in text.split("scan-report.json", 1)[1][:20]


def test_submit_wait_says_where_the_output_went(server: str, migrated: Path) -> None:
    """`jobs submit --wait` names the resolved output (absolute, on the server), not only the status."""
    (migrated / "data" / "a.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"},'
                                               ' {"role": "assistant", "content": "hello"}]}\n')  # fmt: skip
    ran, thread = _run_the_first_job()
    r = runner.invoke(
        app,
        ["jobs", "submit", "convert", "-p", "inputs=data/a.jsonl", "-p", "to=openai",
         "-p", "out=data/ui_train.jsonl", "--wait"],
    )  # fmt: skip
    thread.join(timeout=30)
    assert ran == ["succeeded"] and r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    where = str((migrated / "data" / "ui_train.jsonl").resolve())
    assert f"succeeded output {where} 1 row, " in text
    assert Path(where).exists() and not (migrated / "data" / "data").exists()


def test_in_process_summaries_name_the_absolute_output(
    dd_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "work"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "a.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"},'
                                             ' {"role": "assistant", "content": "hello"}]}\n')  # fmt: skip
    monkeypatch.chdir(folder)
    r = runner.invoke(
        app, ["convert", "data/a.jsonl", "--to", "openai", "--out", "data/x.jsonl", "--report", "r.json"]
    )
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"wrote {folder.resolve() / 'data' / 'x.jsonl'}: 1 row, " in text
    assert f"report: {folder.resolve() / 'r.json'}" in text


def _jobs_list(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "app.cli.main", "jobs", "list"]
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_jobs_talk_to_the_server_up_recorded(tmp_path: Path) -> None:
    """`draftdeck up --port P` records where it serves; `draftdeck jobs` without --server or
    DRAFTDECK_SERVER talks to it and says so; once the server is gone its record is not followed."""
    env = {k: v for k, v in os.environ.items() if k not in ("DRAFTDECK_TOKEN", "DRAFTDECK_SERVER")}
    env["DRAFTDECK_HOME"] = str(tmp_path / "home")
    for name in ("DATABASE_URL", "DRAFTDECK_DATABASE_URL", "REDIS_URL", "DRAFTDECK_REDIS_URL"):
        env.pop(name, None)  # embedded: SQLite and the file broker under the home
    port = _free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "up", "--port", str(port)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    record = tmp_path / "home" / "server.json"
    try:
        deadline = time.monotonic() + 90
        while True:
            r = _jobs_list(env)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert r.returncode == 0, r.stderr
        said = " ".join(r.stderr.split())
        assert f"server http://127.0.0.1:{port}, the server draftdeck up runs ({record})" in said
        assert json.loads(record.read_text())["url"] == f"http://127.0.0.1:{port}"
    finally:
        os.killpg(up.pid, 15)
        up.wait(timeout=60)
    r = _jobs_list(env)
    assert "the default: no draftdeck up is running here" in " ".join(r.stderr.split())


def test_serving_commands_register_list_and_remove_over_http(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.serving import VllmStandIn, serving

    monkeypatch.setenv("DRAFTDECK_TOKEN", TOKEN)
    vllm = VllmStandIn(k=2, engines=("0",))
    with serving(vllm.text) as metrics:
        added = runner.invoke(
            app, ["serving", "add", "prod", metrics.url, "--kind", "vllm", "--interval", "1"]
        )
        assert added.exit_code == 0, added.output
        endpoint_id = int(added.stdout.strip().splitlines()[-1])
        deadline = time.monotonic() + 20
        while metrics.scrapes < 2 and time.monotonic() < deadline:  # the server's scraper reads it
            vllm.decode("m", "0", [2, 0])
            time.sleep(0.2)
        listed = runner.invoke(app, ["serving", "list"])
        assert listed.exit_code == 0 and "prod" in listed.stdout and " ok " in listed.stdout, listed.output
        refused = runner.invoke(app, ["serving", "add", "other", "file:///etc/passwd"])
        assert refused.exit_code == 2 and "expected an http:// or https:// URL" in " ".join(
            refused.output.split()
        )
        removed = runner.invoke(app, ["serving", "remove", str(endpoint_id)])
        assert removed.exit_code == 0 and "removed endpoint" in removed.stdout
        again = runner.invoke(app, ["serving", "remove", str(endpoint_id)])
        assert again.exit_code == 2 and f"no serving endpoint {endpoint_id}" in " ".join(again.output.split())
