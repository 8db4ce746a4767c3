"""cache-hidden as chunk tasks with real workers, on both stacks: two workers share the slices through
the broker and the merged cache holds what `draftdeck cache-hidden` builds in one process, row for row;
a chunk whose worker was killed runs again on the live one and the job succeeds."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.integration.conftest import Stack, wait_for
from tests.integration.test_tokenize_chunks import _chunk_rows, _ended, _kill_running_chunk, _ready
from tests.unit.hidden.test_slices import assert_same_cache

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The learnable 2-layer target and 24 rows of its own text (tests/unit/hidden's world)."""
    from tests.support.drafter import greedy_text, learnable_target, write_dataset

    root = tmp_path_factory.mktemp("hidden-world")
    target = learnable_target(root / "target")
    return {"target": target, "ds": write_dataset(root / "ds", greedy_text(target, 24), target)}


@pytest.fixture
def client(stack: Stack) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def _world(stack: Stack, tiny: dict[str, Path]) -> dict[str, Path]:
    """The world inside the stack's data root, where jobs may read it."""
    return {k: Path(shutil.copytree(v, stack.data / k)) for k, v in tiny.items()}


def _submit(client: TestClient, world: dict[str, Path], out: Path, chunk_rows: int) -> int:
    params = {"inputs": [str(world["ds"])], "target": str(world["target"]), "out": str(out), "dtype": "fp32",
              "chunk_rows": chunk_rows}  # fmt: skip
    r = client.post("/api/jobs", json={"kind": "cache-hidden", "params": params})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_two_workers_share_the_slices_and_merge_the_cli_cache(
    stack: Stack, client: TestClient, tiny: dict[str, Path]
) -> None:
    from typer.testing import CliRunner

    from app.store.db import session_scope
    from app.store.metrics import points_since
    from draftdeck.cli import app

    world = _world(stack, tiny)
    cli_out = stack.home / "cli-cache"
    args = ["cache-hidden", str(world["ds"]), "--target", str(world["target"]), "--out", str(cli_out),
            "--dtype", "fp32"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output

    stack.start_worker()
    stack.start_worker()
    wait_for(lambda: _ready(stack, 2), 60, "two workers", stack)
    job_id = _submit(client, world, stack.data / "cache", chunk_rows=3)
    job = wait_for(_ended(client, job_id), 120, "the cache-hidden job to end", stack)
    assert job["status"] == "succeeded", (job["error"], stack.worker_logs())
    chunks = _chunk_rows(job_id)
    assert len(chunks) == 8 and all(c.status == "done" for c in chunks)
    assert len({c.worker for c in chunks}) == 2, f"one worker ran every chunk: {[c.worker for c in chunks]}"
    assert (job["result"]["rows_in"], job["result"]["rows_out"], job["result"]["chunks"]) == (24, 24, 8)
    assert (job["progress_done"], job["progress_total"]) == (24, 24)
    assert sum(o["rows"] for o in job["outputs"]) == 24
    assert_same_cache(cli_out, stack.data / "cache")
    assert not (stack.home / "jobs" / str(job_id) / "chunks").exists(), "the slices are merged away"
    with session_scope() as session:  # the throughput as chunks were done: a point as each is done
        points, _ = points_since(session, job_id, ["cache/tokens_per_s", "cache/mb_per_s"], 0)
    assert len(points) >= 8 and all((p[5] or 0) > 0 for p in points)


def test_a_slice_whose_worker_died_runs_again_and_the_cache_is_whole(
    stack: Stack, client: TestClient, tiny: dict[str, Path]
) -> None:
    world = _world(stack, tiny)
    stack.start_worker()
    job_id = _submit(client, world, stack.data / "cache", chunk_rows=1000)  # one slice: all 24 rows
    dead = _kill_running_chunk(stack, job_id, 0)
    job = wait_for(_ended(client, job_id), 120, "the job to end", stack)
    assert job["status"] == "succeeded", (job["error"], stack.worker_logs())
    [chunk] = _chunk_rows(job_id)
    assert (chunk.status, chunk.losses) == ("done", 1) and chunk.worker != dead
    from draftdeck.hidden.store import HiddenCache

    cache = HiddenCache(stack.data / "cache")
    assert cache.mf.rows == 24 and cache.verify_checksums() == []
