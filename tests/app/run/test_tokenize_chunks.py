# ruff: noqa: F811 - pytest fixtures imported from tokenize_helpers
"""Tokenizing in chunks: the chunked run gives the in-process run's dataset, in any chunk order; the
job runs as chunk tasks (here called inline, in reverse order) with SQL bookkeeping, cancellation
and failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from sqlmodel import col, select

from app.run.submit import request_cancel
from app.run.sweeper import mark_lost_jobs
from draftdeck.errors import InputError, JobFailed, UsageError
from draftdeck.quality import Report
from draftdeck.shards.stats import Stats
from draftdeck.shards.store import ShardDataset
from draftdeck.tokenize.chunks import tokenize_chunk, tokenize_files_chunked
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.support.chunks import JOB_LIMITS, assert_same_dataset, write_chat_input
from tests.support.planted import Payload, plant_pickle
from tests.support.tokenize import small_dir  # noqa: F401


def test_chunked_run_equals_the_in_process_run_in_any_order(tmp_path: Path, small_dir: Path) -> None:
    src = write_chat_input(tmp_path / "in.jsonl", 60)
    opts = TokenizeOptions(
        small_dir, workers=2, shard_rows=25, chunk_size=4, seq_length=96, on_missing="drop"
    )
    whole = tokenize_files([src], tmp_path / "whole", opts)
    assert whole.warnings["duplicate_conversation"] >= 5  # across chunk boundaries too
    assert whole.warnings["truncated"] > 0
    chunked = tokenize_files_chunked([src], tmp_path / "chunked", tmp_path / "parts", opts, chunk_rows=9,
                                     order=lambda cs: cs[::-1])  # fmt: skip
    assert_same_dataset(tmp_path / "whole", tmp_path / "chunked")
    assert chunked.to_dict()["rejected"] == whole.to_dict()["rejected"]
    assert (chunked.rows_in, chunked.rows_out) == (whole.rows_in, whole.rows_out)
    chunked.check_accounting()
    ds = ShardDataset(tmp_path / "chunked")
    n_chunks = len(json.loads((tmp_path / "parts" / "plan.json").read_text())["chunks"])
    assert n_chunks == chunked.extra["encoder"]["chunks"] > 5
    # shard_rows counts output rows, as in the in-process run: the same cut, the same files
    assert [s.rows for s in ds.shards] == [s.rows for s in ShardDataset(tmp_path / "whole").shards]
    assert {s.rows for s in ds.shards[:-1]} == {25} and len(ds.shards) > 2
    assert [s.sha256 for s in ds.shards] == [s.sha256 for s in ShardDataset(tmp_path / "whole").shards]
    assert [o.rows for o in chunked.outputs] == [s.rows for s in ds.shards]
    assert not list((tmp_path / "chunked").glob("chunk-*"))


def test_chunked_run_fails_like_the_in_process_run_and_leaves_no_shard(
    tmp_path: Path, small_dir: Path
) -> None:
    src = write_chat_input(tmp_path / "in.jsonl", 20)
    opts = TokenizeOptions(small_dir, workers=1, on_missing="error")
    (tmp_path / "in2.jsonl").write_text(
        src.read_text() + json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n"
    )
    with pytest.raises(JobFailed, match="no assistant turn") as whole:
        tokenize_files([tmp_path / "in2.jsonl"], tmp_path / "whole", opts)
    # the reading stage rejects prompt-only rows before tokenizing, in both runs
    with pytest.raises(JobFailed, match="no assistant turn") as chunked:
        tokenize_files_chunked([tmp_path / "in2.jsonl"], tmp_path / "chunked", tmp_path / "parts", opts, 4)
    assert isinstance(chunked.value.report, Report) and isinstance(whole.value.report, Report)
    assert chunked.value.report.to_dict()["rejected"] == whole.value.report.to_dict()["rejected"]
    assert not (tmp_path / "chunked").exists() and not (tmp_path / "whole").exists()  # not even empty


# -- the job: chunk tasks with SQL bookkeeping (tasks called inline, no broker consumer) -------------
def _submit(migrated: Path, small_dir: Path, n: int, **params: object) -> tuple[int, Path, Path]:
    from app.settings import get_settings
    from app.store import records as jobs
    from app.store.db import session_scope
    from draftdeck.kinds import get_kind

    data = migrated / "data"
    src = write_chat_input(data / "chat.jsonl", n)
    tok = data / "tok"
    tok.mkdir()
    for f in small_dir.iterdir():
        (tok / f.name).write_bytes(f.read_bytes())
    kind = get_kind("tokenize")
    raw = {"inputs": str(src), "tokenizer": str(tok), "on_missing": "drop", **params}
    p = kind.params.model_validate(raw).confined(get_settings().roots)
    with session_scope() as session:
        job = jobs.create_job(session, "tokenize", p.model_dump(), kind.queue)
    assert job.id is not None
    return job.id, src, tok


def _chunks(job_id: int) -> list:
    from app.store.db import session_scope
    from app.store.models import JobChunk

    with session_scope() as session:
        return list(
            session.exec(
                select(JobChunk).where(col(JobChunk.job_id) == job_id).order_by(col(JobChunk.chunk_index))
            )
        )


def test_job_runs_as_chunk_tasks_and_gives_the_cli_dataset(
    migrated: Path, small_dir: Path, tmp_path: Path
) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.settings import get_settings
    from app.store import records as jobs
    from app.store.db import session_scope
    from app.store.models import JobOutput

    job_id, src, tok = _submit(migrated, small_dir, 40, chunk_rows=8, shard_rows=20)
    assert run_job(job_id) == "handed-off"  # the job's task plans, enqueues and returns
    chunks = _chunks(job_id)
    assert len(chunks) == 6 and all(c.status == "pending" and c.task_id for c in chunks)
    with session_scope() as session:
        job = jobs.get_job(session, job_id)
        assert job is not None and job.status == "running"
        assert (job.progress_done, job.progress_total, job.progress_unit) == (0, 6, "chunks")
    results = [run_chunk(job_id, c.chunk_index) for c in reversed(chunks)]
    assert results == ["done"] * 5 + ["succeeded"], results  # the last to finish runs the final step
    assert run_chunk(job_id, 3) == "skipped:job-succeeded"  # a redelivered message does nothing
    chunks = _chunks(job_id)
    assert all(c.status == "done" and c.worker for c in chunks)
    assert chunks[0].finalized_by and sum(c.rows_out or 0 for c in chunks) > 0
    with session_scope() as session:
        job = jobs.get_job(session, job_id)
        outputs = list(session.exec(select(JobOutput).where(JobOutput.job_id == job_id)))
    assert job is not None and job.status == "succeeded" and job.result is not None
    assert job.result["rows_out"] == sum(c.rows_out or 0 for c in chunks) == sum(o.rows for o in outputs)
    assert (job.progress_done, job.progress_total) == (job.result["rows_in"], job.result["rows_in"])
    out = get_settings().jobs_dir / str(job_id) / "dataset"
    rows = job.result["rows_out"]
    n = -(-rows // 20)  # shards of shard_rows=20 output rows, not one per chunk of 8 conversations
    assert sorted(Path(o.path).name for o in outputs) == [f"data-{i:05d}-of-{n:05d}.arrow" for i in range(n)]
    assert sorted(o.rows for o in outputs) == sorted([20] * (rows // 20) + ([rows % 20] if rows % 20 else []))
    assert not (get_settings().jobs_dir / str(job_id) / "chunks").exists(), "chunk files are removed"

    cli = tmp_path / "cli"
    opts = TokenizeOptions(tok, shard_rows=20, workers=2, on_missing="drop", **JOB_LIMITS)
    tokenize_files([src], cli, opts)
    assert_same_dataset(cli, out)


def test_cancel_stops_the_chunks_and_removes_their_shards(migrated: Path, small_dir: Path) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.settings import get_settings
    from app.store import records as jobs
    from app.store.db import session_scope

    job_id, _, _ = _submit(migrated, small_dir, 30, chunk_rows=10)
    assert run_job(job_id) == "handed-off"
    assert run_chunk(job_id, 0) == "done"
    out = get_settings().jobs_dir / str(job_id) / "dataset"
    assert (out / "chunk-00000.arrow").is_file()
    with session_scope() as session:
        request_cancel(session, job_id, get_settings())
    assert run_chunk(job_id, 1) == "cancelled"
    assert [c.status for c in _chunks(job_id)] == ["done", "cancelled", "skipped", "skipped"]
    assert run_chunk(job_id, 2) == "skipped:job-cancelled"
    with session_scope() as session:
        job = jobs.get_job(session, job_id)
    assert job is not None and job.status == "cancelled"
    assert not list(out.glob("*.arrow")), "a cancelled job leaves no shard"


def test_a_failing_policy_fails_the_job_in_the_final_step(migrated: Path, small_dir: Path) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.settings import get_settings
    from app.store import records as jobs
    from app.store.db import session_scope

    job_id, _, _ = _submit(migrated, small_dir, 20, chunk_rows=10, strict=True, seq_length=40)
    assert run_job(job_id) == "handed-off"
    assert [run_chunk(job_id, c.chunk_index) for c in _chunks(job_id)][-1] == "failed"
    with session_scope() as session:
        job = jobs.get_job(session, job_id)
    assert job is not None and job.status == "failed" and "--strict" in (job.error or ""), job and job.error
    assert job.result is not None and job.result["rows_out"] > 0
    assert job.result is not None and job.result["warnings"]["truncated"] > 0
    assert not list((get_settings().jobs_dir / str(job_id) / "dataset").glob("*.arrow"))


def test_waiting_chunks_keep_the_job_alive_a_dead_chunk_does_not(migrated: Path, small_dir: Path) -> None:
    """The sweeper leaves a job alone while chunks wait in the queue (no chunk beats for it then) and a
    live worker serves it; a chunk whose worker died in it a second time fails the job (its own beat
    is stale), naming the chunk."""
    from datetime import timedelta

    from sqlalchemy import update

    from app.run import liveness
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.run.sweeper import sweep
    from app.store import records as jobs
    from app.store.db import session_scope
    from app.store.models import Job, JobChunk, utcnow

    job_id, _, _ = _submit(migrated, small_dir, 20, chunk_rows=10)
    assert run_job(job_id) == "handed-off"
    old = utcnow() - timedelta(hours=1)
    with session_scope() as session:
        liveness.beat(session, "celery@test", ["cpu"])
        session.execute(update(Job).where(col(Job.id) == job_id).values(heartbeat_at=old))
        session.commit()
        assert mark_lost_jobs(session, 30) == []
    n = len(_chunks(job_id))
    assert n >= 2 and [run_chunk(job_id, i) for i in range(1, n)] == ["done"] * (n - 1)
    with session_scope() as session:  # chunk 0: claimed by a worker that then died, for the second time
        session.execute(update(JobChunk).where(col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == 0)
                        .values(status="running", losses=1, started_at=old, heartbeat_at=old))  # fmt: skip
        session.execute(update(Job).where(col(Job.id) == job_id).values(heartbeat_at=old))
        session.commit()
        assert sweep(session, 30).lost_chunks == [(job_id, 0)]
        job = jobs.get_job(session, job_id)
    assert job is not None and job.status == "failed" and (job.error or "").startswith("worker lost: chunk 0")
    assert run_chunk(job_id, 0) == "skipped:job-failed"


def test_a_job_failed_between_its_chunk_lost_and_its_failure_names_the_chunk(
    migrated: Path, small_dir: Path
) -> None:
    """Two sweepers: one marks chunk 0 lost (committed) and is about to fail the job; the other, in
    between, finds the job stale with no chunk running or waiting. It fails the job for the lost
    chunk, not for a missing heartbeat."""
    from datetime import timedelta

    from sqlalchemy import update

    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.store import records as jobs
    from app.store.db import session_scope
    from app.store.models import Job, JobChunk, utcnow

    job_id, _, _ = _submit(migrated, small_dir, 20, chunk_rows=10)
    assert run_job(job_id) == "handed-off"
    n = len(_chunks(job_id))
    assert [run_chunk(job_id, i) for i in range(1, n)] == ["done"] * (n - 1)
    why = "chunk 0 lost twice (worker celery@w:1, no heartbeat for 13 s)"
    with session_scope() as session:
        session.execute(update(JobChunk).where(col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == 0)
                        .values(status="lost", losses=1, error=why))  # fmt: skip
        session.execute(
            update(Job).where(col(Job.id) == job_id).values(heartbeat_at=utcnow() - timedelta(hours=1))
        )
        session.commit()
        assert mark_lost_jobs(session, 30) == [job_id]
        job = jobs.get_job(session, job_id)
    assert job is not None and job.error == f"worker lost: {why}"


def _unreachable_token_tokenizer(small_dir: Path, dest: Path) -> Path:
    """The small BPE plus a vocabulary entry no merge produces: tiktoken and HF disagree on 'qqqq'."""
    spec = json.loads((small_dir / "tokenizer.json").read_text())
    spec["model"]["vocab"]["qqqq"] = max(spec["model"]["vocab"].values()) + 1
    spec["model"]["ignore_merges"] = False
    shutil.copytree(small_dir, dest)
    (dest / "tokenizer.json").write_text(json.dumps(spec))
    return dest


def _mismatch_input(path: Path) -> Path:
    """'qqqq' in the first batch of the first chunk (always checked) and deep in a later chunk, where
    only the sampled rows are checked."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"hello {i}"},
                {"role": "assistant", "content": f"fine {i}"},
            ]
        }
        for i in range(60)
    ]
    for i in (1, 45):
        rows[i]["messages"][1]["content"] = "qqqq"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_an_encoder_mismatch_reruns_the_fast_chunks_on_hf_like_the_in_process_run(
    tmp_path: Path, small_dir: Path
) -> None:
    tok = _unreachable_token_tokenizer(small_dir, tmp_path / "tok")
    src = _mismatch_input(tmp_path / "in.jsonl")
    opts = TokenizeOptions(tok, workers=1, chunk_size=4, verify_every=1000)
    whole = tokenize_files([src], tmp_path / "whole", opts)
    assert whole.extra["encoder"]["used"] == "hf" and whole.warnings["encoder_mismatch"] == 1
    chunked = tokenize_files_chunked([src], tmp_path / "chunked", tmp_path / "parts", opts, chunk_rows=20,
                                     order=lambda cs: cs[::-1])  # fmt: skip
    assert chunked.extra["encoder"]["used"] == "hf", chunked.extra["encoder"]
    assert chunked.warnings["encoder_mismatch"] == 1
    assert_same_dataset(tmp_path / "whole", tmp_path / "chunked")


def test_job_reruns_fast_chunks_after_an_encoder_mismatch(
    migrated: Path, small_dir: Path, tmp_path: Path
) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.settings import get_settings
    from app.store import records as jobs
    from app.store.db import session_scope

    bad = _unreachable_token_tokenizer(small_dir, tmp_path / "badtok")
    job_id, _, _ = _submit(migrated, bad, 0, chunk_rows=20)
    src = _mismatch_input(migrated / "data" / "chat.jsonl")
    with session_scope() as session:  # the job reads its input when it runs: give it the mismatch input
        job = jobs.get_job(session, job_id)
        assert job is not None
        job.params = {**job.params, "inputs": [str(src)]}
        session.add(job)
        session.commit()
    assert run_job(job_id) == "handed-off"
    # chunk 1 (no 'qqqq') runs on tiktoken; chunk 0 finds 'qqqq' and leaves the marker; chunk 2 then
    # runs on HF; the final step sends chunk 1 back to run on HF
    assert [run_chunk(job_id, i) for i in (1, 0, 2)] == ["done", "done", "rerun"]
    assert [c.status for c in _chunks(job_id)] == ["done", "pending", "done"]
    assert run_chunk(job_id, 1) == "succeeded"
    with session_scope() as session:
        job = jobs.get_job(session, job_id)
    assert job is not None and job.result is not None
    assert job.result["encoder"]["used"] == "hf" and job.result["warnings"]["encoder_mismatch"] == 1
    ref = tmp_path / "ref"
    tokenize_files(
        [src], ref, TokenizeOptions(migrated / "data" / "tok", workers=1, encoder="hf", on_missing="drop")
    )
    from tests.support.chunks import table

    assert table(ref).equals(table(get_settings().jobs_dir / str(job_id) / "dataset"))


def test_chunks_recorded_but_never_enqueued_do_not_keep_the_job_alive(
    migrated: Path, small_dir: Path
) -> None:
    from datetime import timedelta

    from sqlalchemy import update

    from app.run.job import run_job
    from app.store.db import session_scope
    from app.store.models import Job, JobChunk, utcnow

    job_id, _, _ = _submit(migrated, small_dir, 10, chunk_rows=10)
    assert run_job(job_id) == "handed-off"
    with session_scope() as session:  # the planning worker died between recording and enqueueing
        session.execute(update(JobChunk).where(col(JobChunk.job_id) == job_id).values(task_id=None))
        session.execute(
            update(Job).where(col(Job.id) == job_id).values(heartbeat_at=utcnow() - timedelta(hours=1))
        )
        session.commit()
        assert mark_lost_jobs(session, 30) == [job_id]


def test_planted_chunk_files_run_nothing_and_are_refused_by_name(tmp_path: Path, small_dir: Path) -> None:
    """Chunk files lie in a job folder under a path the user chose: they are JSON lines, never pickles,
    so a pickle planted there is refused naming the file (and so is a statistics file holding a pickled
    object array); nothing it asks for runs."""
    marker = tmp_path / "ran"
    opts = TokenizeOptions(small_dir, seq_length=96)
    parts = tmp_path / "parts"
    parts.mkdir()
    planted = plant_pickle(parts / "input-00000.jsonl", marker)
    with pytest.raises(UsageError, match=r"input-00000\.jsonl, line 1: not a chunk file's conversation"):
        tokenize_chunk(planted, 0, tmp_path / "ds", parts, opts)
    stats = parts / "stats-00000.npz"
    np.savez(stats, token_counts=np.array([Payload(marker)], dtype=object))
    with pytest.raises(InputError, match=r"stats-00000\.npz: not the statistics file"):
        Stats.load_state(stats)
    assert not marker.exists()


def test_the_chunked_job_reads_with_the_column_mapping_it_was_given(migrated: Path, small_dir: Path) -> None:
    """The job's plan step read the inputs with only strict and from_format: a mapped file's rows were
    all rejected (undetected shape) in the service while the CLI kept them."""
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.store import records as jobs
    from app.store.db import session_scope

    job_id, src, _ = _submit(migrated, small_dir, 4, chunk_rows=8, columns={"prompt": "q", "response": "a"})
    rows = [{"q": f"What is {i} + 1?", "a": f"{i + 1}."} for i in range(12)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_job(job_id) == "handed-off"
    results = [run_chunk(job_id, c.chunk_index) for c in _chunks(job_id)]
    assert results[-1] == "succeeded", results
    with session_scope() as session:
        job = jobs.get_job(session, job_id)
    assert job is not None and job.result is not None
    assert (job.result["rows_in"], job.result["rows_out"]) == (12, 12), job.result
