"""The train and eval kinds in the job system: queues, parameters confined like every kind's, and a
Retry of a train job that continues in the failed attempt's folder (where its checkpoints are)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update
from sqlmodel import Session, col

from app.run import submit
from app.settings import get_settings
from app.store import records
from app.store.models import Job, JobStatus
from draftdeck.errors import PathNotAllowedError, UsageError
from draftdeck.kinds import KINDS


def test_train_and_eval_go_to_the_gpu_queue_and_regenerate_where_it_generates() -> None:
    assert KINDS["train"].queue == KINDS["eval"].queue == "gpu"
    regen = KINDS["regenerate"]
    local = regen.params.model_validate({"inputs": ["p.jsonl"], "out": "o.jsonl", "local": "m"})
    remote = regen.params.model_validate(
        {"inputs": ["p.jsonl"], "out": "o.jsonl", "endpoints": ["http://x"], "model": "m"}
    )
    assert (regen.queue_for(local), regen.queue_for(remote)) == ("gpu", "cpu")


def test_a_train_job_over_http_takes_paths_inside_the_roots_only(migrated: Path) -> None:
    settings = get_settings()
    (settings.home / "ds").mkdir()
    (settings.home / "target").mkdir()
    kind, params, queue = submit.validate(
        "train", {"inputs": ["ds"], "target": "target", "max_steps": 3}, settings
    )
    assert (kind, queue) == ("train", "gpu") and Path(params["inputs"][0]) == (settings.home / "ds").resolve()
    with pytest.raises((PathNotAllowedError, UsageError), match=r"outside|not inside|roots"):
        submit.validate("train", {"inputs": ["/etc"], "target": "target"}, settings)
    with pytest.raises(UsageError, match="lr_typo: Extra inputs"):
        submit.validate("train", {"inputs": ["ds"], "target": "target", "lr_typo": 1}, settings)


def test_retry_of_a_train_job_resumes_in_the_failed_attempts_folder(migrated: Path) -> None:
    from app.store.db import session_scope

    settings = get_settings()
    (settings.home / "ds").mkdir()
    (settings.home / "target").mkdir()
    _, params, _ = submit.validate("train", {"inputs": ["ds"], "target": "target"}, settings)
    session: Session
    with session_scope() as session:
        first = records.create_job(session, "train", params, "gpu")
        assert first.id is not None
        session.execute(update(Job).where(col(Job.id) == first.id).values(status=JobStatus.FAILED))
        session.commit()
        second = submit.retry(session, first.id, settings)
        # where the first attempt's checkpoints are: the trainer resumes from the last one there
        assert Path(second.params["out"]) == (settings.jobs_dir / str(first.id)).resolve()
        assert second.attempt == 2 and second.retry_of == first.id
