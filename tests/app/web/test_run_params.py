"""The Parameters table of the run page and the compare view, on runs trained for real (tiny, CPU) and
records the real writer (RunRecord) makes: run.json's nested dicts broken out a row per field, outputs
never a row, only real differences highlighted. The real runs are trained once for the module."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from tests.support.real_run import RealRun, add_real_run, real_run, real_world
from tests.support.web import compare_cells


@pytest.fixture
def client(migrated: Path) -> TestClient:
    from app.web.main import create_app

    return TestClient(create_app())


def _session() -> Session:
    from app.store.db import get_engine

    return Session(get_engine(), expire_on_commit=False)


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RealRun]:
    """A DFlash and an EAGLE-3 run trained for real (tiny, CPU), each with a real eval."""
    world = real_world(tmp_path_factory.mktemp("real-runs"))
    return {
        "dflash": real_run(world, "dflash", drafter="dflash", block_size=4, layers=1),
        "eagle3": real_run(world, "eagle3", drafter="eagle3", ttt_steps=3),
        # the first run again but for --loss: what the compare view must single out
        "dflash_kl": real_run(world, "dflash-kl", drafter="dflash", block_size=4, layers=1, loss="kl"),
    }


def _params(page: str) -> dict[str, tuple[bool, list[str]]]:
    """The Parameters table: {data-param: (highlighted, [each run's cell as text])}."""
    table = page.split('id="params"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r'<tr (class="diff")? ?data-param="([^"]+)">(.*?)</tr>', table, re.S)
    return {
        key: (
            bool(diff),
            [
                " ".join(re.sub("<[^>]+>", "", c).split())
                for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
            ],
        )
        for diff, key, body in rows
    }


@pytest.mark.slow
def test_runs_table_filters_and_compare_highlights_differences(
    client: TestClient, real_runs: dict[str, RealRun]
) -> None:
    """Two real runs that differ only in --loss: the compare view highlights the loss and nothing else;
    not the checkpoint paths (outputs, in every run's own folder: no parameter row at all), not
    run.json's nested dicts (broken out into a row a field, the same in both)."""
    from app.store.models import Job

    with _session() as s:
        a, _ = add_real_run(s, real_runs["dflash"])
        b, _ = add_real_run(s, real_runs["dflash_kl"])
        failed = s.get(Job, b)
        assert failed is not None
        failed.status = "failed"
        s.add(failed)
        s.commit()
    table = client.get("/runs?status=failed", headers={"accept": "text/html"}).text
    assert f'data-run="{b}"' in table and f'data-run="{a}"' not in table
    found = client.get("/runs?q=dflash-kl", headers={"accept": "text/html"}).text  # its folder's name
    assert f'data-run="{b}"' in found and f'data-run="{a}"' not in found
    page = client.get(f"/runs/compare?ids={a}&ids={b}", headers={"accept": "text/html"}).text
    params = _params(page)
    assert [k for k, (diff, _) in params.items() if diff] == ["loss"]
    assert '<p class="small" id="params-differ">1 field differs (highlighted): loss</p>' in page
    loss = params["loss"][1]
    assert "CE_k + KL" in loss[0] and "CE" not in loss[1] and "KL(p_target || q_draft)" in loss[1]
    # the drafter's config and the lr schedule, a row a field, the same in both runs
    assert params["drafter.block_size"] == (False, ["4", "4"]) and params["drafter.layers"] == (
        False,
        ["1", "1"],
    )
    assert params["drafter.kind"] == (False, ["dflash", "dflash"])
    assert params["lr_schedule.lr"] == (False, ["0.0006", "0.0006"])
    assert params["lr_schedule.optimizer"] == (False, ["adamw", "adamw"])
    assert params["total_steps"] == (False, ["4", "4"])
    # outputs and what the page shows apart are no parameters; a field repeated below is listed once
    assert not set(params) & {"checkpoints", "steps_done", "best_step", "lr_schedule", "drafter"}
    assert not [k for k in params if k.split(".")[0] in {"truth", "memory", "provenance"}]
    assert "data.inputs" not in params and "inputs" in params
    record = json.loads((Path(real_runs["dflash"].params["out"]) / "run.json").read_text())
    assert record["checkpoints"] and not any(
        c in page.split('id="params"', 1)[1] for c in record["checkpoints"]
    )
    # the fields compared most come first, in this order
    assert list(params)[:4] == [
        "drafter.kind",
        "drafter.block_size",
        "drafter.layers",
        "drafter.target_layer_ids",
    ]
    assert list(params).index("loss") < list(params).index("lr_schedule.lr") < list(params).index("seed")
    assert list(params).index("seed") < list(params).index("drafter.hidden_size")
    assert "&lt;|MASK|&gt;" in page and "<|MASK|>" not in page  # the mask token, escaped
    single = _params(client.get(f"/runs/{a}", headers={"accept": "text/html"}).text)
    assert set(single) == set(params) and not any(diff for diff, _ in single.values())
    assert client.get("/runs/compare", headers={"accept": "text/html"}).status_code == 400


@pytest.mark.slow  # two tiny runs trained and evaluated for real: half a minute on two shared cores
def test_compare_and_run_pages_of_real_dflash_and_eagle3_runs(
    client: TestClient, real_runs: dict[str, RealRun]
) -> None:
    """The compare view's "Drafts over" row and an EAGLE-3 run page's subtitle from run.json, index.json,
    metric points and eval.json as the trainer and the eval write them: the hand-written records of the
    test above carry fields the real ones may name otherwise or not write."""
    with _session() as s:
        d, d_eval = add_real_run(s, real_runs["dflash"])
        e, e_eval = add_real_run(s, real_runs["eagle3"])
    coverage = real_runs["eagle3"].draft_vocab_coverage  # counted apart from the run, not read from it
    assert coverage is not None and 0 < coverage < 1
    drafts_over = f"20 draft ids, {100 * coverage:.1f} % of trained tokens, from &lt;v&gt;.npz"
    page = client.get(f"/runs/compare?ids={d}&ids={e}", headers={"accept": "text/html"}).text

    def cells(label: str) -> list[str]:
        return compare_cells(page, label)

    assert cells("Drafter") == ["DFlash, blocks of 4 (3 drafts)", "EAGLE-3, chains of 3 drafts"]
    assert cells("Drafts over") == ["the target&#39;s whole vocabulary", drafts_over]
    real = [
        json.loads((Path(r.eval_params["out"]) / "eval.json").read_text())["eval"]["methods"]["drafter"]
        for r in (real_runs["dflash"], real_runs["eagle3"])
    ]
    assert cells("Real τ") == [f"{m['tau_incl_bonus_pooled']:.3f}" for m in real]
    assert cells("Tokens per verify step") == [f"{m['tokens_per_step']:.3f}" for m in real]
    assert cells("Training steps") == ["4", "4"]  # the trainer counts steps from 1: max_steps
    assert all(c[0].isdigit() for c in cells("τ walked, judged by the target"))
    single = client.get(f"/runs/{e}", headers={"accept": "text/html"}).text
    assert (
        f'<p class="subtitle">EAGLE-3, chains of 3 drafts over {drafts_over} · <a href="/runs">'
    ) in single
    assert f'href="/jobs/{e_eval}"' in single  # its real eval, matched to the run by its checkpoint
    plain = client.get(f"/runs/{d}", headers={"accept": "text/html"}).text
    assert '<p class="subtitle">DFlash, blocks of 4 (3 drafts) · <a href="/runs">' in plain
    assert f'href="/jobs/{d_eval}"' in plain


@pytest.mark.slow
def test_a_run_lists_the_options_of_its_own_drafter_kind_only(
    client: TestClient, real_runs: dict[str, RealRun]
) -> None:
    """A DFlash train job's page listed EAGLE-3's ttt_steps, step_decay and eagle3_layer_ids: the train
    job's parameters hold every kind's options, and its pages list its own kind's (and the shared ones);
    so does the run page, from run.json's fields broken out (the drafter's config by field)."""
    with _session() as s:
        d, _ = add_real_run(s, real_runs["dflash"])
        e, _ = add_real_run(s, real_runs["eagle3"])

    def listed(url: str, start: str, end: str) -> set[str]:  # a run page's fields by their last name
        section = client.get(url, headers={"accept": "text/html"}).text.split(start, 1)[1].split(end, 1)[0]
        keys = re.findall(r'data-param="([\w.]+)"', section)
        return set(re.findall(r"<dt>(\w+)</dt>", section)) | {k.rsplit(".", 1)[-1] for k in keys}

    eagle3_only, dflash_only = (
        {"ttt_steps", "step_decay", "eagle3_layer_ids", "draft_vocab", "draft_vocab_size"},
        {"anchors_per_seq", "gamma"},
    )
    for url, start, end in (
        (f"/jobs/{d}", "<h2>Parameters</h2>", "</dl>"),
        (f"/runs/{d}", 'id="params"', "</table>"),
    ):
        shown = listed(url, start, end)
        assert dflash_only | {"block_size", "lr", "target"} <= shown and not shown & eagle3_only, url
        assert not shown & {"markov_rank", "selector_rank"}  # DSpark's and DFlash2's own
    for url, start, end in (
        (f"/jobs/{e}", "<h2>Parameters</h2>", "</dl>"),
        (f"/runs/{e}", 'id="params"', "</table>"),
    ):
        shown = listed(url, start, end)
        assert {"ttt_steps", "step_decay", "lr", "target"} <= shown, url
        assert not shown & (dflash_only | {"block_size"}), url
    run_page = _params(client.get(f"/runs/{e}", headers={"accept": "text/html"}).text)
    assert list(run_page)[:2] == ["drafter.kind", "drafter.draft_vocab_size"]  # its own options first
    assert run_page["drafter.ttt_steps"] == (False, ["3"])


def test_the_parameters_of_a_run_record_are_its_fields_broken_out_outputs_apart() -> None:
    """run_parameters reads the record's structure, not a list of names: a field a later version adds
    (the drafter's, the schedule's) is a row without a line of the page's code; the outputs never are."""
    from app.web.run_params import param_table, run_parameters
    from draftdeck.drafter.train.run_record import RunRecord

    def record(lr: float, out: str) -> dict[str, Any]:
        return RunRecord(
            inputs=["/data/ds"], manifest_sha256=["ab" * 32], target="/models/t",
            drafter={"block_size": 8, "layers": 2, "new_knob": "<on>"}, loss="ce", gamma=7.0,
            anchors_per_seq=512, seq_length=None, seed=0, world_size=1, global_batch=8,
            lr_schedule={"lr": lr, "optimizer": "adamw", "betas": [0.9, 0.95]},
            data={"inputs": ["/data/ds"], "rows_in": 10}, steps_done=5, total_steps=10, best_step=4,
            checkpoints=[f"{out}/checkpoints/step-00000004"], memory={"total_bytes": 1},
            truth={"alert": None},
        ).to_dict()  # fmt: skip

    trains = {"drafter": "dflash"}
    a, b = (run_parameters(record(lr, out), trains) for lr, out in ((3e-4, "/runs/a"), (1e-3, "/runs/b")))
    rows = {r["key"]: r for r in param_table([a, b])}
    assert [k for k, r in rows.items() if r["differ"]] == ["lr_schedule.lr"]
    assert rows["lr_schedule.lr"]["cells"] == [
        {"text": "0.0003", "title": ""},
        {"text": "0.001", "title": ""},
    ]
    assert rows["drafter.new_knob"]["cells"][0] == {"text": "<on>", "title": ""}  # the page escapes it
    assert rows["lr_schedule.betas"]["cells"][0]["text"] == "0.9, 0.95"
    assert rows["manifest_sha256"]["cells"][0] == {"text": "abababababab…", "title": "ab" * 32}
    assert rows["seq_length"]["cells"] == [None, None]  # no value: a dash
    assert not {"checkpoints", "steps_done", "best_step", "data.inputs", "memory.total_bytes"} & set(rows)
    assert list(rows)[:4] == ["drafter.kind", "drafter.block_size", "drafter.layers", "loss"]
    assert list(rows).index("seed") < list(rows).index("drafter.new_knob")  # the rest: the record's order
    # before the trainer wrote run.json: the job's parameters, less where it writes
    queued = run_parameters({"out": "/runs/a", "lr": 1e-3, "seed": 1, "drafter": "dflash"}, trains)
    assert [p.path for p in queued] == ["drafter", "lr", "seed"]
