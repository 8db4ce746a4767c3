"""`draftdeck train --report-to` against a real `draftdeck web`: the run shows as a job with its
points, and a server restart in the middle of the run loses nothing and repeats nothing (the spool
keeps what the server could not take)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from draftdeck.drafter.train.reporter import Reporter
from draftdeck.jobs.context import LocalContext
from tests.browser.harness import REPO_ROOT, free_port
from tests.support.datasets import start_web, stop_group
from tests.support.drafter import greedy_text, learnable_target, write_dataset
from tests.support.launch import torchrun_nodes

STEPS = 480  # long enough (a few seconds) to be running while its server restarts


def _serve(home: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    return start_web(home, home.parent, log, port)  # the run, its data and target: all within the roots


def _get(url: str) -> Any:
    return json.loads(urllib.request.urlopen(url, timeout=10).read())


@pytest.mark.slow
def test_a_run_reports_live_and_a_server_restart_loses_and_repeats_nothing(tmp_path: Path) -> None:
    target = learnable_target(tmp_path / "target")
    ds = write_dataset(tmp_path / "ds", greedy_text(target, 48), target)
    home, port, log = tmp_path / "home", free_port(), tmp_path / "web.log"
    url = f"http://127.0.0.1:{port}"
    server = _serve(home, port, log)
    run = tmp_path / "run"
    train = subprocess.Popen(
        [sys.executable, "-m", "draftdeck.cli", "train", str(ds), "--target", str(target), "--out", str(run),
         "--block-size", "4", "--anchors-per-seq", "8", "--batch-size", "4", "--max-steps", str(STEPS),
         "--log-every", "1", "--eval-every", "160", "--checkpoint-every", "160", "--heldout-fraction", "0.15",
         "--device", "cpu", "--report-to", url],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while (
            not (run / "report" / "job-1.acked").is_file()
            or int((run / "report/job-1.acked").read_text()) < 5
        ):
            assert train.poll() is None and time.monotonic() < deadline, (
                train.stdout.read() if train.stdout else ""
            )
            time.sleep(0.1)
        stop_group(server)  # the server goes away mid-run ...
        time.sleep(3)
        server = _serve(home, port, log)  # ... and comes back with the same home
        output = train.communicate(timeout=300)[0]
        assert train.returncode == 0, output
        assert "does not answer: the points are kept" in output, output
        job = _get(f"{url}/api/jobs/1")
        said = [e["message"] for e in job["events"]]
        assert any("does not answer: the points are kept" in m for m in said), said  # the log says when
        assert job["status"] == "succeeded" and job["worker"].startswith("external:"), job["error"]
        assert job["result"]["steps"] == STEPS and job["progress_done"] == STEPS
        with sqlite3.connect(next(home.rglob("draftdeck.db"))) as db:
            rows = db.execute(
                "SELECT step FROM metric_points WHERE job_id = 1 AND name = 'train/loss'"
            ).fetchall()
        steps = [int(step) for (step,) in rows]
        assert sorted(steps) == list(range(1, STEPS + 1))  # every step once: none lost, none twice
        mirrored = json.loads((home / "jobs" / "1" / "run.json").read_text())
        assert mirrored["steps_done"] == STEPS and (home / "jobs/1/checkpoints/index.json").is_file()
    finally:
        if train.poll() is None:
            train.kill()
        stop_group(server)


def _rank_process(rank: int, out: Path) -> int | None:
    """The pid of the training process of `rank` whose run folder is `out` (torchrun's worker)."""
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if (
            f"RANK={rank}".encode() in env
            and b"TORCHELASTIC_RUN_ID" in b"".join(env)
            and str(out).encode() in cmd
        ):
            return int(proc.name)
    return None


@pytest.mark.slow
def test_a_node_killed_fails_the_run_cleanly_and_a_relaunch_resumes(tmp_path: Path) -> None:
    """Two torchrun nodes report one run; node 1's process is killed: the run fails on the server
    naming why, and the same launch again is the job's next attempt, resumed from the last checkpoint."""
    import signal

    target = learnable_target(tmp_path / "target")
    ds = write_dataset(tmp_path / "ds", greedy_text(target, 48), target)
    home, port = tmp_path / "home", free_port()
    url, run = f"http://127.0.0.1:{port}", tmp_path / "run"
    server = _serve(home, port, tmp_path / "web.log")

    def launch(steps: int) -> list[subprocess.Popen[str]]:
        shape = ["--block-size", "4", "--anchors-per-seq", "8", "--batch-size", "4"]
        every = ["--max-steps", f"{steps}"]
        every += ["--checkpoint-every", "5", "--eval-every", "5", "--heldout-fraction", "0.15"]
        where = ["--device", "cpu", "--sharding", "fsdp", "--report-to", url]
        return torchrun_nodes([str(ds), "--target", str(target), "--out", str(run), *shape, *every, *where])

    nodes = launch(100_000)
    try:
        deadline = time.monotonic() + 180
        while not (run / "checkpoints" / "index.json").is_file():
            assert all(n.poll() is None for n in nodes) and time.monotonic() < deadline
            time.sleep(0.2)
        pid = _rank_process(1, run)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        nodes[0].communicate(timeout=120)
        nodes[1].communicate(timeout=120)
        job = _get(f"{url}/api/jobs/1")
        assert job["status"] == "failed" and "another rank of this run stopped" in job["error"], job["error"]
        nodes = launch(1)  # the same launch again (a step count it has passed: it ends on resuming)
        assert [n.communicate(timeout=180)[0] and n.returncode for n in nodes] == [0, 0]
        again = _get(f"{url}/api/jobs/2")
        assert (again["status"], again["retry_of"], again["attempt"]) == ("succeeded", 1, 2)
        assert any(e["message"].startswith("resumed from step") for e in again["events"])
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
        stop_group(server)


def test_batches_fit_the_server_s_limit_and_an_item_too_large_is_named(tmp_path: Path) -> None:
    """The server takes 1 MiB a request: a run's report is cut by bytes, not only by items (300 events
    of 7 KB were one 2 MB batch, answered 413 and taken as final, which silenced the run); an item alone
    too large becomes a note under its number, and the end still ends the job."""
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    server = _serve(home, port, tmp_path / "web.log")
    try:
        params = {
            "inputs": [str(tmp_path / "ds")],
            "target": str(tmp_path / "t"),
            "out": str(tmp_path / "run"),
        }
        reporter = Reporter(url, tmp_path / "run", params, 1, LocalContext(tmp_path / "ctx"))
        for i in range(300):
            reporter.event("info", f"line {i} " + "x" * 7000)
        result = {"rows_in": 1, "rows_out": 1, "checkpoints": ["/p" * 2000] * 400}  # 1.6 MB
        assert reporter.end("succeeded", "done", result)
        job = _get(f"{url}/api/jobs/1")
        assert job["status"] == "succeeded" and job["result"] is None
        said = [e["message"] for e in job["events"]]
        assert sum(m.startswith("line ") for m in said) == 300
        assert said[-1] == "succeeded: done (its result was too large for the server and was not sent)"
        # cut by bytes before sending: the end alone was refused as too large (the access log says so)
        assert (tmp_path / "web.log").read_text().count('/report HTTP/1.1" 413') == 1
    finally:
        stop_group(server)
