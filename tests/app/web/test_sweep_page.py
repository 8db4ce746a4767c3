"""The sweep page (/sweeps/{job}) through the real app, from a real sweep's sweep.json on the tiny world:
the scatter with the Pareto front and the recommended point, the table sorted by a column, the flags
escaped, and the links to it from the job page and from the leaderboard's run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.store.models import Job
from draftdeck.drafter.eval.sweep_front import Point
from tests.support.sweep import RealSweep, real_sweep


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> RealSweep:
    return real_sweep(tmp_path_factory.mktemp("sweep-page"))


@pytest.fixture
def client(migrated: Path) -> TestClient:
    from app.web.main import create_app

    return TestClient(create_app())


def _add(swept: RealSweep) -> tuple[int, int, int]:
    """The run holding the checkpoint, the sweep as a succeeded job, and one of its points' evals as an
    eval job (what the leaderboard lists): (run, sweep, eval)."""
    from app.store.db import get_engine

    point = json.loads((swept.out / "points" / "2" / "eval.json").read_text())
    with Session(get_engine(), expire_on_commit=False) as s:
        jobs = [
            Job(kind="train", params={"out": str(swept.checkpoint.parent)}, status="succeeded"),
            Job(kind="sweep", params=swept.params, status="succeeded", queue="gpu", result=swept.result),
            Job(kind="eval", params={"checkpoint": str(swept.checkpoint)}, status="succeeded", queue="gpu",
                result=point),
        ]  # fmt: skip
        for job in jobs:
            s.add(job)
            s.commit()
        ids = [job.id for job in jobs]
    assert all(isinstance(i, int) for i in ids)
    return ids[0] or 0, ids[1] or 0, ids[2] or 0


def _rows(html: str) -> dict[int, list[str]]:
    body = html.split('id="sweep-table"', 1)[1].split("</table>", 1)[0]
    return {
        int(m[1]): [
            " ".join(re.sub(r"<[^>]+>", " ", c).split())
            for c in re.findall(r"<td[^>]*>(.*?)</td>", m[2], re.S)
        ]
        for m in re.finditer(r'<tr id="point-(\d+)"[^>]*>(.*?)</tr>', body, re.S)
    }


def test_the_sweep_page_charts_tabulates_and_recommends_the_real_sweep(
    client: TestClient, swept: RealSweep
) -> None:
    run, sweep_id, eval_id = _add(swept)
    sweep = swept.result["sweep"]
    points = {p["point"]: Point.from_json(p) for p in sweep["points"]}
    page = client.get(f"/sweeps/{sweep_id}")
    assert page.status_code == 200
    html = page.text
    rows = _rows(html)
    assert list(rows) == [0, 1, 2, 3]
    for n, cells in rows.items():
        p = points[n]
        assert cells[1:3] == [str(p.params["block_size"]), p.params["mode"]]
        assert p.verified_per_step is not None
        assert cells[3] == f"{p.tau:.3f}" and cells[4] == f"{p.verified_per_step:.2f}"
        assert cells[8] == {True: "yes", None: "sampled", False: "no"}[p.lossless]
        assert ("front" in cells[9]) == (n in sweep["pareto"])
    # sorted by tau, highest first; a second click sorts the other way
    by_tau = _rows(client.get(f"/sweeps/{sweep_id}?sort=tau&order=desc").text)
    taus = [points[n].tau or 0.0 for n in by_tau]
    assert taus == sorted(taus, reverse=True) and set(by_tau) == set(points)
    # the scatter: a dot per point, the front's joined, the recommended one ringed
    svg = html.split('id="sweep-scatter"', 1)[1].split("</svg>", 1)[0]
    assert len(re.findall(r'<circle class="dot', svg)) == 4
    assert len(re.findall(r'<circle class="dot front', svg)) == len(sweep["pareto"])
    assert svg.count('class="ring"') == 1 and f'data-point="{sweep["recommended"]}"' in svg
    # the flags to serve, escaped as text (the JSON's quotes too), and the honest note on speed
    serve = html.split('id="sweep-recommended"', 1)[1].split("</section>", 1)[0]
    vllm = next(r for r in sweep["serving"] if r["server"] == "vLLM")
    assert vllm["flags"].replace('"', "&#34;").replace("'", "&#39;") in serve and '"method"' not in serve
    assert f'href="#point-{sweep["recommended"]}"' in serve and "Copy" in serve
    assert "carry over to a GPU" in html and "Measured on cpu" in html
    # linked from the sweep's job page and from the leaderboard's row of the run it swept
    assert f'href="/sweeps/{sweep_id}"' in client.get(f"/jobs/{sweep_id}").text
    board = client.get("/evals").text
    assert (
        f'href="/runs/{run}"' in board and f'href="/sweeps/{sweep_id}#point-{sweep["recommended"]}"' in board
    )
    assert client.get(f"/sweeps/{eval_id}").status_code == 404  # an eval is no sweep


def test_the_sweep_kind_has_its_form_and_api_from_its_parameters(client: TestClient) -> None:
    form = client.get("/jobs/new?kind=sweep").text
    assert 'name="grid"' in form and 'name="prompts"' in form and 'name="block_size"' in form
    schema = client.get("/api/kinds").json()["sweep"]["params"]
    assert {"grid", "prompts", "target", "mode"} <= set(schema["properties"]) and "grid" in schema["required"]


def test_a_sweep_job_is_submitted_through_the_api_and_a_bad_grid_refused_by_name(
    client: TestClient, migrated: Path
) -> None:
    data = migrated / "data"
    for folder in ("ckpt", "target"):
        (data / folder).mkdir(parents=True, exist_ok=True)
    (data / "prompts.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    params = {"inputs": "data/ckpt", "target": "data/target", "prompts": "data/prompts.jsonl"}
    bad = client.post("/api/jobs", json={"kind": "sweep", "params": {**params, "grid": ["tree_size=8"]}})
    assert bad.status_code == 400 and "'tree_size' is not a sweepable eval option" in bad.text
    r = client.post("/api/jobs", json={"kind": "sweep", "params": {**params, "grid": ["block_size=4,8"]}})
    assert r.status_code == 201
    job = client.get(f"/api/jobs/{r.json()['id']}").json()
    assert job["queue"] == "gpu" and job["params"]["prompts"] == [str((data / "prompts.jsonl").resolve())]
