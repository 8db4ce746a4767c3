"""The `tiny-target` kind as a job: what `draftdeck demo` builds first, with its progress (the target's
training steps) on the dashboard, and a folder every other kind takes as a target."""

from __future__ import annotations

from pathlib import Path

from sqlmodel import select

from app.run import submit
from app.run.job import run_job
from app.settings import get_settings
from app.store import records
from app.store.db import session_scope
from app.store.models import JobEvent
from draftdeck.drafter.tiny_job import is_built


def test_a_tiny_target_job_builds_a_target_with_its_progress_in_steps(migrated: Path) -> None:
    settings = get_settings()
    _, params, queue = submit.validate(
        "tiny-target", {"out": "world", "target_steps": 3, "prompts": 5}, settings
    )
    with session_scope() as session:
        job = records.create_job(session, "tiny-target", params, queue)
        job_id = job.id or 0
    assert run_job(job_id, in_process=True) == "succeeded"
    folder = Path(params["out"])
    assert is_built(folder) and (folder / "target" / "config.json").is_file()
    assert len((folder / "prompts.jsonl").read_text().splitlines()) == 5
    with session_scope() as session:
        done = records.get_job(session, job_id)
        assert done is not None and done.result is not None and done.result["rows_out"] == 5
        # its progress stays in its own unit when it succeeds (a train job read "160 rows" for 100 steps)
        assert (done.progress_done, done.progress_total, done.progress_unit) == (3, 3, "steps")
        said = [e.message for e in session.exec(select(JobEvent).where(JobEvent.job_id == job_id))]
    assert any(m.startswith("target step 3/3 loss") for m in said), said  # the build's log on its page
