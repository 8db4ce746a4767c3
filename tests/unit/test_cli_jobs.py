"""The CLI mirrors the API: submit, list, show, cancel, retry; scan in-process; exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftdeck.cli import app
from tests.conftest import REPO_ROOT

runner = CliRunner()


def test_jobs_commands_round_trip(migrated: Path) -> None:
    (migrated / "data" / "a.jsonl").write_text('{"messages": []}\n')
    r = runner.invoke(app, ["jobs", "submit", "scan", "--param", f"path={migrated}/data/a.jsonl"])
    assert r.exit_code == 0, r.output
    job_id = int(r.output.strip())
    listed = runner.invoke(app, ["jobs", "list"])
    assert listed.exit_code == 0 and "scan" in listed.output and "queued" in listed.output
    shown = runner.invoke(app, ["jobs", "show", str(job_id), "--json"])
    assert json.loads(shown.output)["params"]["path"].endswith("data/a.jsonl")
    assert runner.invoke(app, ["jobs", "cancel", str(job_id)]).exit_code == 0
    again = runner.invoke(app, ["jobs", "cancel", str(job_id)])
    assert again.exit_code == 2 and "only queued or running" in again.output
    retried = runner.invoke(app, ["jobs", "retry", str(job_id)])
    assert retried.exit_code == 0 and int(retried.output.strip()) != job_id


@pytest.mark.parametrize(
    "args,message",
    [
        (["jobs", "submit", "scan", "--param", "path=/etc/passwd"], "outside the data roots"),
        (["jobs", "submit", "scan", "--param", "nokeyvalue"], "KEY=VALUE"),
        (["jobs", "submit", "teleport"], "unknown job kind"),
        (["jobs", "show", "999"], "no job 999"),
        (["scan", "/etc/passwd"], "outside the data roots"),
    ],
)
def test_usage_errors_exit_2(migrated: Path, args: list[str], message: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())


def test_scan_exit_codes_and_report(migrated: Path, tmp_path: Path) -> None:
    good = migrated / "data" / "good.jsonl"
    good.write_text('{"messages": []}\nbroken\n')
    r = runner.invoke(app, ["scan", str(good), "--report", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["rows_in"], report["rows_out"], report["rejected"]) == (2, 1, {"json_error": 1})
    empty = migrated / "data" / "empty.jsonl"
    empty.write_text("")
    r = runner.invoke(app, ["scan", str(empty)])
    assert r.exit_code == 1 and "empty input" in r.output


def test_up_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DRAFTDECK_TOKEN"}
    env["DRAFTDECK_HOME"] = str(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "draftdeck.cli", "up", "--host", "0.0.0.0", "--port", "8799"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "without DRAFTDECK_TOKEN" in r.stderr + r.stdout
