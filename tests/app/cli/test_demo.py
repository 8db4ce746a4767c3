"""`draftdeck demo --quick`: the whole path (tiny target -> regenerate -> tokenize -> train -> eval) as
jobs in the configured database, ending with one JSON line, and the run page drawing what it wrote."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, col, select

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)  # the quick demo alone takes 2-4 minutes here; beside another test worker, more
def test_quick_demo_runs_every_step_as_a_job_and_reports_honest_figures(dd_home: Path) -> None:
    work = dd_home / "demo"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "demo", "--quick", "--workdir", str(work)],
        cwd=dd_home, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(summary) == {"train_tau", "heldout_tau", "heldout_tau_target", "eval_tau",
                            "eval_tokens_per_step", "untrained_tau", "prompt_lookup_tau", "eval_speedup",
                            "lossless", "checkpoint"}  # fmt: skip
    assert summary["eval_speedup"] > 0
    assert summary["heldout_tau_target"] is not None
    assert summary["lossless"] is True
    assert summary["untrained_tau"] == pytest.approx(1.0, abs=0.05)  # a fresh drafter accepts ~nothing
    assert summary["eval_tau"] > summary["untrained_tau"]
    # the quick world shows the drafter's point: clearly above copying from the prompt
    assert summary["eval_tau"] > 1.5 * summary["prompt_lookup_tau"], summary
    said = done.stderr
    # the tiny target is built by a job (its progress and log on the dashboard), then the path runs
    assert "job 1 tiny-target: running" in said and "world ready" in said and "job 4 train: running" in said
    assert "run page: http://" in said and "%|" not in said  # a full address; no library progress bars
    # torch's threads are the idle cores, said (all of them spin against other work on a shared machine)
    assert re.search(r"torch threads: \d+, the idle cores of \d+ \(load \d+\.\d", said), said[:2000]
    assert Path(summary["checkpoint"], "model.safetensors").is_file()
    eval_json = json.loads((work / "eval" / "eval.json").read_text())["eval"]
    assert eval_json["methods"]["drafter"]["tau_incl_bonus_pooled"] == summary["eval_tau"]
    # z-lab's convention beside it: no bonus past a stop, so never above vLLM's
    assert eval_json["methods"]["drafter"]["tokens_per_step"] == summary["eval_tokens_per_step"]
    assert 1 <= summary["eval_tokens_per_step"] <= summary["eval_tau"]

    from app.store.db import get_engine
    from app.store.models import Alert, Job, JobEvent, JobStateHistory, MetricSeries
    from app.store.run_figures import ALARM_KINDS

    with Session(get_engine()) as session:
        jobs = session.exec(select(Job).order_by(Job.id)).all()  # type: ignore[arg-type]
        assert [(j.kind, j.status) for j in jobs] == [
            (kind, "succeeded") for kind in ("tiny-target", "regenerate", "tokenize", "train", "eval")
        ]
        built = session.exec(select(JobEvent.message).where(JobEvent.job_id == jobs[0].id)).all()
        assert any(m.startswith("target step 1/") for m in built), built
        jobs = jobs[1:]  # the path itself
        train = jobs[2]
        history = session.exec(select(JobStateHistory).where(JobStateHistory.job_id == train.id)).all()
        assert [(h.from_status, h.to_status) for h in history] == [
            ("queued", "running"),
            ("running", "succeeded"),
        ]
        names = {s.name for s in session.exec(select(MetricSeries).where(MetricSeries.job_id == train.id))}
        # the demo's data is its target's own greedy output: no run or eval says otherwise
        truth = session.exec(select(Alert).where(col(Alert.kind).in_(ALARM_KINDS))).all()
        assert truth == [], [a.message for a in truth]
        # and it is what a careful user's data is: distinct prompts, no alert a newcomer must ignore
        alerts = session.exec(select(Alert)).all()
        assert alerts == [], [(a.kind, a.message) for a in alerts]
    assert {
        "train/loss",
        "heldout/walked/accepted",
        "heldout/walked/steps",
        "train/pos/1/correct",
        "heldout/target_walked/steps",
        "heldout/agreement/tokens",
        "preflight/agreement/tokens",
    } <= names
    from app.web.main import create_app

    with TestClient(create_app()) as client:
        # each job page shows what its kind measured: rows/s and endpoint health, tau per draft source
        regen_page, eval_page = client.get(f"/jobs/{jobs[0].id}").text, client.get(f"/jobs/{jobs[3].id}").text
        assert 'id="endpoint-health"' in regen_page and "rows/s" in regen_page
        assert 'id="eval-methods"' in eval_page and "prompt lookup" in eval_page
        assert f"{summary['eval_tau']:.3f}" in eval_page
        page = client.get(f"/runs/{train.id}")
        assert page.status_code == 200 and "incl. bonus" in page.text
        # the run page's Export button starts an export job of the run folder (its best checkpoint)
        assert 'name="kind" value="export-drafter"' in page.text
        # the Export button passes the run's target: its tokenizer checks the mask as SGLang reads it
        assert f'name="target" value="{train.params["target"]}"' in page.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        made = client.post(
            "/jobs",
            data={"kind": "export-drafter", "inputs": str(work / "run"), "csrf": csrf[1]},
            follow_redirects=False,
        )
        assert made.status_code == 303 and made.headers["location"].startswith("/jobs/"), made.text[-500:]
        data = client.get("/runs/data", params={"jobs": train.id, "names": "heldout/tau_walked"})
        assert data.status_code == 200, data.text
        walked = [y for series in data.json()["series"] for y in series["y"] if y is not None]
        # the best checkpoint's walked tau is one of the points (compared as numbers, not as text:
        # 2.9695 rounds to 2.970 but its text starts 2.96)
        assert any(abs(y - summary["heldout_tau"]) < 1e-6 for y in walked), (summary, walked)

    exported = dd_home / "exported"
    cli = subprocess.run(
        [sys.executable, "-m", "draftdeck.cli", "export-drafter", str(work / "run"), "--out", str(exported)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-2000:]
    config = json.loads((exported / "config.json").read_text())
    assert config["dflash_config"]["block_size"] == 8 and (exported / "model.safetensors").is_file()


def test_the_demos_eagle3_run_drafts_as_many_tokens_a_step_on_the_same_budget() -> None:
    from app.cli.demo import demo_train_params

    dflash, eagle3 = (
        demo_train_params(k, ["ds"], "target", Path("run"), 100, 0) for k in ("dflash", "eagle3")
    )
    assert (dflash.drafter, eagle3.drafter) == ("dflash", "eagle3")
    assert eagle3.ttt_steps == dflash.block_size - 1 == 7  # chains of 7 beside blocks of 8
    same = ("batch_size", "lr", "max_steps", "seed", "heldout_fraction", "checkpoint_every", "eval_every")
    assert {k: getattr(eagle3, k) for k in same} == {k: getattr(dflash, k) for k in same}


def test_a_world_built_earlier_is_reused(dd_home: Path) -> None:
    from app.cli.demo import QUICK, demo_world
    from app.settings import get_settings

    folder = get_settings().home_dir / "demo-worlds" / "qwen3_5-target200-prompts160-seed3"
    (folder / "target").mkdir(parents=True)
    (folder / "ready").write_text("built\n")
    said: list[str] = []
    world = demo_world(QUICK, 3, "qwen3_5", False, said.append)
    assert world.target_dir == folder / "target" and world.prompts == folder / "prompts.jsonl"
    assert said == [f"reusing the tiny world built earlier in {folder} (--rebuild-world builds it again)"]


def test_a_second_demo_takes_the_next_free_folder_under_the_home(tmp_path: Path) -> None:
    from app.cli.demo import free_workdir

    assert free_workdir(tmp_path) == tmp_path / "demo"
    (tmp_path / "demo" / "run").mkdir(parents=True)
    assert free_workdir(tmp_path) == tmp_path / "demo-2"
    (tmp_path / "demo-2").mkdir()
    (tmp_path / "demo-2" / "answers.jsonl").write_text("")
    assert free_workdir(tmp_path) == tmp_path / "demo-3"


@pytest.mark.timeout(900)
def test_the_demo_trains_evaluates_and_exports_each_new_kind(dd_home: Path) -> None:
    """`--drafter dspark` and `--drafter dflash2` (one home: the second reuses the first's world): each
    learns the target clearly past the untrained drafter and prompt lookup, decodes losslessly, its walked
    tau is within 5 % of real decoding on the target's own answers, its run page draws its per-position
    acceptance, and it exports in speculators' format of its kind (whose own classes load it:
    tests/unit/drafter/kinds/test_speculators_interop.py)."""
    from app.web.main import create_app

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for kind, title in (("dspark", "DSpark"), ("dflash2", "DFlash2")):
        work = dd_home / kind
        done = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "demo", "--quick", "--drafter", kind,
             "--workdir", str(work)],
            cwd=dd_home, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["lossless"] is True, summary
        assert summary["untrained_tau"] == pytest.approx(1.0, abs=0.05)
        assert summary["eval_tau"] > 2 * summary["untrained_tau"], summary
        assert summary["eval_tau"] > 2 * summary["prompt_lookup_tau"], summary
        assert abs(summary["heldout_tau_target"] - summary["eval_tau"]) <= 0.05 * summary["eval_tau"], summary
        run_id = int(re.findall(r"/runs/(\d+)", done.stderr)[-1])
        with TestClient(create_app()) as client:
            page = client.get(f"/runs/{run_id}").text
        assert f"{title}, " in page and "7 drafts" in page, page[:2000]
        assert 'name="kind" value="export-drafter"' in page
        exported = dd_home / f"{kind}-export"
        cli = subprocess.run(
            [sys.executable, "-m", "draftdeck.cli", "export-drafter", str(work / "run"),
             "--out", str(exported)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr[-2000:]
        config = json.loads((exported / "config.json").read_text())
        assert config["speculators_model_type"] == kind and (exported / "model.safetensors").is_file()
        assert f"speculators' {title} format" in cli.stdout + cli.stderr
