"""`draftdeck demo --quick --multimodal` (issue 55): a tiny random VLM answers prompts about generated
pictures and text prompts (a regenerate job, its vision tower reading them); tokenize, train and eval
run as jobs with the pictures in the data, and the summary reports real tau on image prompts and on
text prompts apart, lossless."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlmodel import Session, select

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_multimodal_demo_runs_as_jobs_and_reports_image_and_text_prompts(dd_home: Path) -> None:
    work = dd_home / "demo-mm"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "demo", "--quick", "--multimodal", "--workdir", str(work)],
        cwd=dd_home, env=env, capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["lossless"] is True
    assert summary["rows"] == 160 and summary["rows_with_images"] > 0  # every row kept by tokenize
    assert summary["image_prompts"] > 0 and summary["text_prompts"] > 0
    assert summary["eval_tau"] > summary["untrained_tau"]  # the drafter learned something
    assert "image_url" in done.stderr and "<image>" in done.stderr  # both shapes of images in the data

    from app.store.db import get_engine
    from app.store.models import Job

    with Session(get_engine()) as session:
        jobs = session.exec(select(Job)).all()
    assert sorted(j.kind for j in jobs) == ["eval", "regenerate", "tokenize", "train"]
    assert all(j.status == "succeeded" for j in jobs)
