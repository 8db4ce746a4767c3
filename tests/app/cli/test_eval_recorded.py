"""`draftdeck eval` in a terminal is recorded in the home's database (issue 49): the leaderboard (/evals)
lists it, and its run's page shows it, as they show evals that ran as jobs. A real CLI run on a tiny world:
a 2-layer target, a drafter checkpoint inside a training run's folder, three prompts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from tests.conftest import REPO_ROOT
from tests.support.eval import build_world, trained_checkpoint

pytestmark = pytest.mark.slow


def _draftdeck(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DRAFTDECK_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args], cwd=home, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_a_cli_eval_is_on_the_leaderboard_and_its_runs_page(migrated: Path, tmp_path: Path) -> None:
    from app.store.db import get_engine
    from app.store.models import Job
    from app.web.main import create_app

    world = build_world(tmp_path / "world", n_prompts=3, steps=10)
    run_dir = migrated / "runs" / "r1"
    checkpoint = trained_checkpoint(world, run_dir / "step-000002", max_new=8, steps=2)
    with Session(get_engine(), expire_on_commit=False) as s:  # a training run the dashboard knows
        run = Job(kind="train", params={"out": str(run_dir)}, status="succeeded", queue="gpu")
        s.add(run)
        s.commit()

    out = migrated / "evals" / "r1"
    done = _draftdeck(
        migrated, "eval", str(world.prompts), "--target", str(world.target_dir), "--checkpoint",
        str(checkpoint), "--out", str(out), "--max-new-tokens", "8",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = re.search(r"recorded as eval job (\d+) \(succeeded\)", done.stdout)
    assert said, done.stdout[-2000:]
    job_id = int(said[1])

    with Session(get_engine()) as s:
        job = s.exec(select(Job).where(Job.id == job_id)).one()
        assert (job.kind, job.status, job.queue) == ("eval", "succeeded", "cli")
        assert job.params["checkpoint"] == str(checkpoint) and job.params["out"] == str(out)
        assert job.result is not None and job.result["eval"]["prompts"] == 3
        assert job.started_at is not None and job.finished_at is not None

    client = TestClient(create_app())
    board = client.get("/evals")
    assert board.status_code == 200
    row = re.search(rf'<tr data-eval="{job_id}">(.*?)</tr>', board.text, re.S)
    assert row, "the CLI eval is not on the leaderboard"
    assert f'href="/runs/{run.id}"' in row[1]  # its run, found by the checkpoint's folder
    run_page = client.get(f"/runs/{run.id}")
    assert run_page.status_code == 200
    evals = run_page.text.split('id="run-evals-', 1)[1].split("</section>", 1)[0]
    assert f'href="/jobs/{job_id}"' in evals
    assert client.get(f"/jobs/{job_id}").status_code == 200


def test_an_eval_the_database_cannot_take_says_why_and_keeps_its_file(
    dd_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL that is not there (a closed port): the eval stands, the line names the reason."""
    import time

    from app.cli.evals import record_cli_eval
    from app.settings import get_settings
    from app.store.db import get_engine
    from draftdeck.drafter.eval.params import EvalParams
    from draftdeck.jobs.context import LocalContext
    from draftdeck.quality import Report
    from tests.browser.harness import free_port

    monkeypatch.setenv("DATABASE_URL", f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none")
    get_settings.cache_clear()
    get_engine.cache_clear()
    params = EvalParams(inputs=["p.jsonl"], target="t", checkpoint="c", out=str(dd_home / "ev"))
    said = record_cli_eval(params, Report(), LocalContext(dd_home / "ev"), time.time())
    assert said.startswith("not recorded on the dashboard (DATABASE_URL's database): OperationalError"), said
    assert "Connection refused" in said and said.endswith("; eval.json stands") and "\n" not in said
