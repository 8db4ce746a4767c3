"""Run pages and their data routes through the real app on a migrated SQLite home."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, func, select

from app.store.metrics import record_metrics
from app.store.models import MetricValue
from tests.support.run import make_eval, make_run
from tests.support.web import compare_cells


@pytest.fixture
def client(migrated: Path) -> TestClient:
    from app.web.main import create_app

    return TestClient(create_app())


def _session() -> Session:
    from app.store.db import get_engine

    return Session(get_engine(), expire_on_commit=False)


def _jobs_dir() -> Path:
    from app.settings import get_settings

    return get_settings().jobs_dir


def test_run_page_shows_charts_checkpoints_params_and_the_alarm(client: TestClient) -> None:
    with _session() as s:
        run = make_run(s, _jobs_dir(), steps=320, status="succeeded", params={"note": "<b>x</b>"})
        ev = make_eval(s, _jobs_dir(), run, 200, real_tau=1.50, data_tau=1.70, target_tau=1.52,
                       tokens_per_step=1.45)  # fmt: skip
    page = client.get(f"/runs/{run}", headers={"accept": "text/html"})
    assert page.status_code == 200
    html = page.text
    for chart in ("loss", "tau", "agreement", "pos", "lr", "grad", "tps"):
        assert f'id="plot-{chart}"' in html
    assert "anchor mean (optimistic)" in html and "incl. bonus" in html
    assert "judged by the target (its own answers)" in html and "judged by the data (held-out rows)" in html
    alarm = (
        "Real τ 1.500 vs the run's 1.520 judged by the target (+1.3 %) and 1.700 judged by the data (+13.3 %)"
    )
    assert alarm in html and f"eval {ev}" in html
    assert '<tr class="best"><td class="num">300</td>' in html  # checkpoints 100, 200, 300; best: highest tau
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    cfg = json.loads(html.split("data-config='", 1)[1].split("'", 1)[0])
    assert cfg["jobs"] == [run] and cfg["live"] is False
    assert cfg["markers"] == [{"job": run, "eval": ev, "step": 200, "tau": 1.5}]
    assert [n for n, _ in next(c for c in cfg["charts"] if c["id"] == "pos")["series"]] == [
        "train/pos/1/acc",
        "train/pos/2/acc",
        "train/pos/3/acc",
    ]
    # the evals table is full width below the histogram and checkpoints: half the page cut it at "By dat…"
    grid, below = html.split('<div class="run-grid">', 1)[1].split("\n</div>\n", 1)
    assert 'class="small evals"' not in grid and f'id="run-evals-{run}"' in below
    evals = html.split('class="small evals"', 1)[1].split("</table>", 1)[0]
    assert (
        "vLLM's counters" in evals and "z-lab's benchmark" in evals and '<td class="num">1.450</td>' in evals
    )
    said = " ".join(html.split('class="muted small eval-context"', 1)[1].split("</p>", 1)[0].split())
    assert "the untrained drafter τ 1.000, prompt lookup τ 1.200 · 1.50x the tokens/s of target-only" in said
    table = client.get("/runs", headers={"accept": "text/html"}).text
    assert f'data-run="{run}"' in table and alarm in table
    assert f'<a href="/jobs/{ev}">1.500</a> / 1.450' in table  # the latest eval, both conventions
    baselines = " ".join(
        table.split('class="muted small eval-baselines"', 1)[1].split("</div>", 1)[0].split()
    )
    assert "untrained 1.000 · lookup 1.200 · 1.50x tok/s" in baselines  # beside it, on /runs too
    alerts = client.get("/alerts", headers={"accept": "text/html"}).text
    assert '<span class="alert-kind" title="data_not_target_output">data not target output</span>' in alerts
    assert (
        "real tau 1.500 (all 100 prompts), the run&#39;s held-out tau at step 200 judged by the data 1.700"
        in alerts
    )


def test_compare_puts_a_dflash_and_an_eagle3_run_side_by_side(client: TestClient) -> None:
    with _session() as s:
        d = make_run(s, _jobs_dir(), steps=60, status="succeeded", params={"drafter": "dflash"})
        e = make_run(
            s, _jobs_dir(), steps=60, status="succeeded",
            params={"drafter": "eagle3", "ttt_steps": 3, "block_size": 16, "draft_vocab": "/d/<v>.npz"},
        )  # fmt: skip
        make_eval(s, _jobs_dir(), d, 50, real_tau=2.25, data_tau=2.4, target_tau=2.3, tokens_per_step=2.2)
        make_eval(s, _jobs_dir(), e, 50, real_tau=1.75, data_tau=1.8, target_tau=1.76)
    page = client.get(f"/runs/compare?ids={d}&ids={e}", headers={"accept": "text/html"}).text

    def cells(label: str) -> list[str]:
        return compare_cells(page, label)

    assert cells("Drafter") == ["DFlash, blocks of 4 (3 drafts)", "EAGLE-3, chains of 3 drafts"]
    assert cells("Drafts over") == [
        "the target&#39;s whole vocabulary", "32,000 draft ids, 97.3 % of trained tokens, from &lt;v&gt;.npz",
    ]  # fmt: skip
    assert cells("Real τ") == ["2.250", "1.750"]  # each run's eval, both in vLLM's convention
    assert cells("Tokens per verify step") == ["2.200", "\N{EN DASH}"]  # not measured: a dash
    assert cells("Training steps") == ["59", "59"]
    assert all(c[0].isdigit() for c in cells("τ walked, judged by the target"))
    assert "Every τ counts the bonus token" in page
    single = client.get(f"/runs/{e}", headers={"accept": "text/html"}).text
    assert 'id="compare-table"' not in single
    assert (
        '<p class="subtitle">EAGLE-3, chains of 3 drafts over 32,000 draft ids, 97.3 % of trained tokens,'
        ' from &lt;v&gt;.npz · <a href="/runs">'
    ) in single
    cfg = json.loads(single.split("data-config='", 1)[1].split("'", 1)[0])
    pos = [n for n, _ in next(c for c in cfg["charts"] if c["id"] == "pos")["series"]]
    assert pos == ["train/pos/1/acc", "train/pos/2/acc", "train/pos/3/acc"]  # TTT steps 0..2


def test_data_route_validates_and_times_itself(client: TestClient) -> None:
    with _session() as s:
        run = make_run(s, _jobs_dir(), steps=200, status="succeeded")
    r = client.get(f"/runs/data?jobs={run}&names=train/loss&names=heldout/tau_walked&budget=50")
    assert r.status_code == 200 and r.headers["server-timing"].startswith("app;dur=")
    body = r.json()
    loss, tau = body["series"]
    assert loss["x"][0] == 0 and loss["x"][-1] == 199 and len(loss["x"]) <= 52
    assert tau["x"] == [0, 50, 100, 150]
    with _session() as s:
        newest = s.exec(select(func.max(MetricValue.id)).where(MetricValue.job_id == run)).one()
    assert body["cursor"] == {f"m{run}": newest}
    assert client.get(f"/runs/data?jobs={run}&names=train/loss&x=epoch").status_code == 400
    assert client.get("/runs/data?jobs=999&names=train/loss").status_code == 404
    # a range no axis has (steps, tokens and epoch ms are within 0..2^53): refused, never an overflow
    for x in ("step", "tokens", "time"):
        wide = client.get(f"/runs/data?jobs={run}&names=train/loss&x={x}&lo=-{2**62}&hi={2**62}")
        assert wide.status_code == 422, (x, wide.status_code)
        ok = client.get(f"/runs/data?jobs={run}&names=train/loss&x={x}&lo=0&hi={2**53}")
        assert ok.status_code == 200, (x, ok.text)


def test_stream_sends_points_after_the_cursor_then_ends_with_the_run(client: TestClient) -> None:
    from app.store.models import JobStatus
    from app.store.state import propose

    with _session() as s:
        run = make_run(s, _jobs_dir(), steps=10, status="running")
    cursor = client.get(f"/runs/data?jobs={run}&names=train/loss&names=heldout/tau_walked").json()["cursor"]
    url = f"/runs/stream?jobs={run}&names=train/loss&names=heldout/tau_walked&m{run}={cursor[f'm{run}']}"

    def write() -> None:
        time.sleep(0.3)
        with _session() as s:
            record_metrics(s, run, 10, {"train/loss": 0.25}, 90_000)
            record_metrics(
                s, run, 50, {"heldout/walked/accepted": 300.0, "heldout/walked/steps": 200.0}, None
            )
            time.sleep(0.3)
            propose(s, run, JobStatus.SUCCEEDED, "run ended")

    t = threading.Thread(target=write)
    t.start()
    events: list[list[Any]] = []  # [event name, its data...]
    with client.stream("GET", url) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event:"):
                events.append([line.split(":", 1)[1].strip()])
            elif line.startswith("data:"):
                events[-1].append(json.loads(line.split(":", 1)[1]))
    t.join()
    kinds = [e[0] for e in events]
    assert kinds[-1] == "end"
    statuses = [e[1][0]["status"] for e in events if e[0] == "runs"]
    assert statuses == ["running", "succeeded"]
    points = [p for e in events if e[0] == f"m{run}" for p in e[1]]
    assert {(p["name"], p["step"], p["y"]) for p in points} == {
        ("train/loss", 10, 0.25),
        ("heldout/tau_walked", 50, 2.5),
    }
    assert next(p for p in points if p["name"] == "heldout/tau_walked")["tokens"] is None


def test_an_off_target_run_says_so_on_its_run_and_job_pages_with_the_fix(
    client: TestClient, tmp_path: Path
) -> None:
    from urllib.parse import parse_qs, urlparse

    from app.store.models import Alert
    from draftdeck.shards.manifest import Manifest
    from draftdeck.shards.store import write_metadata

    dataset = tmp_path / "ds"
    dataset.mkdir()
    write_metadata(dataset, Manifest(shards=[], inputs=["/data/answers.jsonl"]))
    message = (
        "the data is not this target's output: 1,000 of 1,000 rows are recorded as another model's answers"
    )
    with _session() as s:
        run = make_run(s, _jobs_dir(), steps=120, params={"inputs": [str(dataset)]})
        s.add(Alert(job_id=run, kind="data_not_target_output", message=message))
        s.commit()
        for name, acc in (("/data/a.jsonl", 300.0), ("/data/b.jsonl", 100.0)):
            src = f"heldout/source/{name}"
            values = {f"{src}/walked/accepted": acc, f"{src}/walked/steps": 200.0,
                      f"{src}/target_walked/accepted": acc / 2,
                      f"{src}/target_walked/steps": 200.0}  # fmt: skip
            record_metrics(s, run, 100, values, None)
    run_json = _jobs_dir() / str(run) / "run.json"
    record = json.loads(run_json.read_text())
    record["truth"] = {
        "provenance": "0 of 1,000 rows were answered by this target (1,000 by model 'other' (sha256:…))",
        "preflight": {"tokens": 2000, "matches": 1700, "prob_sum": 1600.0, "expected_sum": 1800.0},
        "alert": message,
        "target_answered_prompts": 64,
    }
    run_json.write_text(json.dumps(record))

    html = client.get(f"/runs/{run}", headers={"accept": "text/html"}).text
    truth = html.split('id="truth"', 1)[1].split("</section>", 1)[0]
    assert "truth-off" in html.split('id="truth"', 1)[0][-80:]
    assert "0 of 1,000 rows were answered by this target" in truth and message.replace("'", "&#39;") in truth
    assert "85.0 % of the time (its own T = 1 samples: 90.0 %), mean p(data token) 0.800" in truth
    assert "judged by the target (64 of its own answers)" in truth
    sources = truth.split('id="truth-sources"', 1)[1]
    assert "/data/a.jsonl" in sources and "2.500" in sources and "1.750" in sources
    # and over the run, a line per source on a chart of its own, from the same counts
    charts = json.loads(html.split("data-config='", 1)[1].split("'", 1)[0].replace("&#34;", '"'))["charts"]
    by_source = next(c for c in charts if c["id"] == "tau-sources")
    assert by_source["series"] == [["heldout/source//data/a.jsonl/tau_walked", "a.jsonl"],
                                   ["heldout/source//data/b.jsonl/tau_walked", "b.jsonl"]]  # fmt: skip
    from app.store.metric_query import query

    with _session() as s:
        [a] = query(s, [run], ["heldout/source//data/a.jsonl/tau_walked"]).series
    assert a.y == [2.5]
    link = truth.split('<a class="button" href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    link_query = parse_qs(urlparse(link).query)
    assert link_query == {
        "kind": ["regenerate"], "inputs": ["/data/answers.jsonl"], "local": ["/models/qwen3-tiny"],
        "temperature": ["0"], "out": ["/data/answers.by-qwen3-tiny.jsonl"],
    }  # fmt: skip
    runs = client.get("/runs", headers={"accept": "text/html"}).text
    assert "data not target output:</strong> " + message.replace("'", "&#39;") + " (" in runs

    job = client.get(f"/jobs/{run}", headers={"accept": "text/html"}).text
    assert 'data-alerts="1"' in job and 'id="job-alerts"' in job
    steps = job.split('id="next-steps"', 1)[1].split("</nav>", 1)[0]
    assert "Regenerate with this target" in steps and "kind=regenerate" in steps


def test_the_run_page_shows_the_memory_estimate_beside_the_measured_peak_and_the_rows_cut(
    client: TestClient,
) -> None:
    memory = {
        "total_bytes": 3 * 2**30,
        "held_bytes": 2**30,
        "phase": "training step",
        "parts_bytes": {"drafter layers": 2**30, "LM head": 2**29, "attention": 2**29},
        "capacity_bytes": 20 * 2**30,
    }
    data = {"truncated_rows": 3, "truncated_tokens": 1234}
    with _session() as s:
        run = make_run(s, _jobs_dir(), steps=20, params={"memory": memory, "data": data, "seq_length": 960})
        record_metrics(s, run, 19, {"train/peak_memory_mib": 2000.0}, 1)
        record_metrics(s, run, 20, {"heldout/peak_memory_mib": 2600.0}, 2)
    html = client.get(f"/runs/{run}", headers={"accept": "text/html"}).text
    panel = html.split('id="memory"', 1)[1].split("</section>", 1)[0]
    assert "<strong>3.0 GiB</strong> before step 1 (training step; 20.0 GiB available)" in panel
    assert "drafter layers 1.0 GiB · LM head 512.0 MiB · attention 512.0 MiB; loaded 1.0 GiB" in panel
    assert "<strong>2.5 GiB</strong>" in panel  # the larger peak: after the held-out pass
    assert "tokens/s" in panel
    assert "3 rows longer than seq_length 960: 1,234 tokens not trained" in panel
    assert 'id="plot-mem"' in html


def _eval_job(methods: dict[str, Any], drafter_kind: str = "dflash", block: int = 4, **extra: Any) -> int:
    """A succeeded eval job whose eval.json holds `methods` (the drafter's and any others)."""
    from app.store.models import Job

    ev = {
        "block_size": block,
        "drafter": drafter_kind,
        "mode": "greedy",
        "methods": methods,
        "walked": {"tau_incl_bonus": None},
        "conventions": "Two counts of one decode: vLLM's and z-lab's.",
        **extra,
    }
    result = {"rows_in": 8, "rows_out": 8, "rejected": {}, "warnings": {}, "eval": ev}
    with _session() as s:
        job = Job(kind="eval", params={}, status="succeeded", queue="gpu", result=result)
        s.add(job)
        s.commit()
        assert job.id is not None
        return job.id


def _drafter_figures(speedup: float, tau: float = 2.4, tokens_per_step: float = 2.25) -> dict[str, Any]:
    return {"tau_incl_bonus_pooled": tau, "tau_incl_bonus_per_response_mean": tau - 0.1,
            "acceptance_rate": 0.35, "tokens_per_s": 40.0, "speedup_vs_target_only": speedup,
            "lossless": True, "tokens_per_step": tokens_per_step}  # fmt: skip


def test_an_eval_slower_than_target_only_says_why(client: TestClient) -> None:
    """On a CPU with a tiny target, verifying a block costs about what decoding it does: the eval page
    says so beside a speed-up below 1, and says nothing when drafting pays."""

    def eval_job(speedup: float, drafter_kind: str = "dflash") -> int:
        return _eval_job({"drafter": _drafter_figures(speedup)}, drafter_kind)

    slow = client.get(f"/jobs/{eval_job(0.68)}", headers={"accept": "text/html"}).text
    assert 'id="eval-methods"' in slow and "0.68x" in slow
    # both conventions, each named for what to compare it with
    table = slow.split('id="eval-methods"', 1)[1].split("</table>", 1)[0]
    assert "vLLM's counters" in table and "z-lab's benchmark" in table
    assert '<td class="num">2.400</td>\n    <td class="num">2.250</td>' in table
    assert 'id="tau-conventions"' in slow
    note = slow.split('id="speedup-note">', 1)[1].split("</p>", 1)[0]
    assert "Drafter drafts run at 0.68\u00d7 the target alone's speed." in note
    assert "tiny target on a CPU" in note and "τ is the figure that carries over" in note
    assert "DFlash, blocks of 4 (3 drafts), greedy; each τ in two conventions" in slow
    fast = client.get(f"/jobs/{eval_job(1.7, 'eagle3')}", headers={"accept": "text/html"}).text
    assert "1.70x" in fast and 'id="speedup-note"' not in fast
    assert "EAGLE-3, chains of 3 drafts, greedy; each τ in two conventions" in fast  # what was drafted


def test_parameter_values_read_as_text_not_json() -> None:
    from app.web.render import param_text

    assert param_text({"mask_token": "<|mask|>", "ids": [1, 9, 17]}) == "mask_token=<|mask|>; ids=1, 9, 17"
    assert param_text(True) == "true" and param_text(3e-4) == "0.0003"


def test_a_confidence_scheduled_eval_shows_both_ways_and_the_drafts_a_step(client: TestClient) -> None:
    """DSpark decoded with full blocks and with blocks its confidence head stopped: both rows, the cut
    and the drafts a step it left, each τ and tokens/s."""
    scheduled = {**_drafter_figures(1.9, tau=3.1), "counts": {"verify_steps": 100, "proposed": 420}}
    job = _eval_job(
        {"drafter": _drafter_figures(1.5, tau=3.6), "drafter_scheduled": scheduled}, "dspark", block=8,
        confidence_threshold=0.5,
    )  # fmt: skip
    page = client.get(f"/jobs/{job}", headers={"accept": "text/html"}).text
    table = page.split('id="eval-methods"', 1)[1].split("</table>", 1)[0]
    assert "DSpark, 7 drafts a step, greedy" in page
    assert "drafter, blocks stopped by confidence" in table and "(below 0.5; 4.20 drafts a step)" in table
    assert "3.600" in table and "3.100" in table and "1.90x" in table and "1.50x" in table


def _provenance(torch_version: str, **kw: Any) -> dict[str, Any]:
    """A run record's provenance as draftdeck.run_provenance writes it."""
    return {
        "python": "3.11.7", "torch": torch_version, "transformers": "5.24.0", "draftdeck": "0.1.0",
        "draftdeck_commit": "436bb986727a1b92806a4dc28de4841848f3b1fd", "draftdeck_dirty": False,
        "command": None, "parameters": {"lr": 0.003}, "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3",
        "world_size": 2,
    } | kw  # fmt: skip


def _with_provenance(run: int, prov: dict[str, Any]) -> None:
    run_json = _jobs_dir() / str(run) / "run.json"
    run_json.write_text(json.dumps(json.loads(run_json.read_text()) | {"provenance": prov}))


def _provenance_row(page: str, label: str) -> list[str]:
    table = page.split('id="provenance-table"', 1)[1].split("</table>", 1)[0]
    row = table.split(f'data-provenance="{label}"', 1)[1].split("</tr>", 1)[0]
    return [c.split("</td>", 1)[0] for c in row.split('<td class="path">')[1:]]


def test_the_run_page_shows_what_the_run_ran_with_escaped(client: TestClient) -> None:
    with _session() as s:
        run = make_run(s, _jobs_dir(), steps=20, status="succeeded")
    command = ["draftdeck", "train", "ds", "--out", "<b>run</b>"]
    _with_provenance(run, _provenance("2.13.0", command=command, draftdeck_dirty=True))
    page = client.get(f"/runs/{run}", headers={"accept": "text/html"}).text
    assert _provenance_row(page, "torch") == ["2.13.0"]
    assert _provenance_row(page, "transformers") == ["5.24.0"]
    assert _provenance_row(page, "DraftDeck") == ["0.1.0, commit 436bb986727a with uncommitted changes"]
    assert _provenance_row(page, "Device") == ["cuda (NVIDIA H100 80GB HBM3)"]
    assert _provenance_row(page, "World size") == ["2"]
    # the command line as typed, its user text escaped; not listed again among the parameters
    assert _provenance_row(page, "Started by") == [
        "draftdeck train ds --out &#39;&lt;b&gt;run&lt;/b&gt;&#39;"
    ]
    assert "<b>run</b>" not in page and 'data-param="provenance"' not in page
    assert 'id="versions-differ"' not in page  # one run: nothing to differ from
    with _session() as s:
        older = make_run(s, _jobs_dir(), steps=20, status="succeeded")  # its run.json records none
    assert 'id="provenance-table"' not in client.get(f"/runs/{older}", headers={"accept": "text/html"}).text


def test_compare_names_the_versions_two_runs_differ_in(client: TestClient) -> None:
    with _session() as s:
        a = make_run(s, _jobs_dir(), steps=20, status="succeeded")
        b = make_run(s, _jobs_dir(), steps=20, status="succeeded")
        c = make_run(s, _jobs_dir(), steps=20, status="succeeded")
    _with_provenance(a, _provenance("2.13.0"))
    _with_provenance(b, _provenance("2.12.1"))
    _with_provenance(c, _provenance("2.13.0", gpu="NVIDIA H200", command=["draftdeck", "train"]))
    page = client.get(f"/runs/compare?ids={a}&ids={b}", headers={"accept": "text/html"}).text
    note = page.split('id="versions-differ">', 1)[1].split("</p>", 1)[0]
    assert "torch 2.13.0 vs 2.12.1" in note and "transformers" not in note
    assert _provenance_row(page, "torch") == ["2.13.0", "2.12.1"]
    # another GPU or command is shown, but only versions are flagged
    same = client.get(f"/runs/compare?ids={a}&ids={c}", headers={"accept": "text/html"}).text
    assert 'id="versions-differ"' not in same
    assert _provenance_row(same, "Started by") == ["a job", "draftdeck train"]
    parameters = _provenance_row(same, "Parameters as given")[0]  # the job's own, folded
    assert "<code>{&#34;lr&#34;: 0.003}</code>" in parameters and "<details>" in parameters


def test_an_eval_page_shows_what_the_eval_ran_with(client: TestClient) -> None:
    prov = _provenance("2.13.0", device="cpu", gpu=None, world_size=1, draftdeck_commit=None)
    page = client.get(
        f"/jobs/{_eval_job({'drafter': _drafter_figures(1.5)}, provenance=prov)}",
        headers={"accept": "text/html"},
    ).text
    assert _provenance_row(page, "torch") == ["2.13.0"] and _provenance_row(page, "Device") == ["cpu"]
    assert _provenance_row(page, "DraftDeck") == ["0.1.0"]  # installed, not a checkout: no commit
