"""The leaderboard (/evals) through the real app on a migrated home: two real suite evals of a tiny
drafter, filtered by thinking mode and suite, sorted by a column, and the CSV equal to the page."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.store.models import Job
from tests.support.eval import suite_evals


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return suite_evals(tmp_path_factory.mktemp("suite-evals"))


@pytest.fixture
def client(migrated: Path) -> TestClient:
    from app.web.main import create_app

    return TestClient(create_app())


def _add(results: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[int, list[int]]:
    """The evals as succeeded jobs beside the training run whose folder holds the checkpoint: (run, evals)."""
    from app.store.db import get_engine

    ids = []
    with Session(get_engine(), expire_on_commit=False) as s:
        run = Job(
            kind="train", params={"out": str(Path(results[0][0]["checkpoint"]).parent)}, status="succeeded"
        )
        s.add(run)
        for params, result in results:
            job = Job(kind="eval", params=params, status="succeeded", queue="gpu", result=result)
            s.add(job)
            s.commit()
            assert job.id is not None
            ids.append(job.id)
        s.add(Job(kind="eval", params={}, status="failed", queue="gpu"))  # not finished: not on the board
        s.commit()
        assert run.id is not None
        return run.id, ids


def _rows(html: str) -> dict[int, list[str]]:
    """The table's cells per eval, as text."""
    body = html.split('id="evals-table"', 1)[1].split("</table>", 1)[0]
    rows = {}
    for m in re.finditer(r'<tr data-eval="(\d+)">(.*?)</tr>', body, re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", m[2], re.S)
        rows[int(m[1])] = [" ".join(re.sub(r"<[^>]+>", " ", c).split()) for c in cells]
    return rows


def test_the_board_filters_sorts_and_exports_what_it_shows(
    client: TestClient, results: list[tuple[dict[str, Any], dict[str, Any]]]
) -> None:
    assert "No finished eval yet" in client.get("/evals").text
    run, (four, two) = _add(results)
    page = client.get("/evals").text
    rows = _rows(page)
    assert list(rows) == [two, four]  # newest first
    tau = {
        i: results[k][1]["eval"]["methods"]["drafter"]["tau_incl_bonus_pooled"]
        for k, i in enumerate((four, two))
    }
    assert rows[four][6] == f"{tau[four]:.3f}" and rows[two][6] == f"{tau[two]:.3f}"
    assert rows[four][5] == "default" and rows[two][5] == "off"  # thinking: the template's default, off
    assert rows[four][1] == rows[two][1] == f"run {run}" and f'href="/runs/{run}"' in page
    assert "vLLM's spec-decode counters" in page and "z-lab's published acceptance lengths" in page
    # the drafter kind by its name, on a phone too (DFlash and EAGLE-3 rows looked alike at 390 px); no
    # served eval here: no column of dashes for it, and the suite's cells come right after "vs target"
    assert rows[four][3] == rows[two][3] == "DFlash" and "<th>Drafter</th>" in page
    assert "served τ" not in page
    # filtered by thinking mode
    assert list(_rows(client.get("/evals?thinking=off").text)) == [two]
    # one suite picked: its categories are columns, each a tau over that category's turns
    by_suite = client.get("/evals?suite=mt-bench").text
    heads = re.findall(r'<th class="num"><a href="[^"]*sort=mt-bench%2F(\w+)', by_suite)
    assert heads == sorted(results[0][1]["eval"]["suites"]["mt-bench"].keys() - {"(all)"})
    coding = results[0][1]["eval"]["suites"]["mt-bench"]["coding"]["methods"]["drafter"][
        "tau_incl_bonus_pooled"
    ]
    assert _rows(by_suite)[four][10 + heads.index("coding")] == f"{coding:.3f}"
    # sorted by tau, both ways
    ascending = list(_rows(client.get("/evals?sort=tau&order=asc").text))
    assert ascending == sorted(tau, key=tau.__getitem__)
    assert list(_rows(client.get("/evals?sort=tau&order=desc").text)) == ascending[::-1]
    # the CSV holds what the page shows, under the same filter
    got = list(csv.DictReader(io.StringIO(client.get("/evals.csv?suite=mt-bench").text)))
    assert [int(r["job"]) for r in got] == [two, four]
    for r in got:
        shown = _rows(by_suite)[int(r["job"])]
        assert (
            f"{float(r['tau']):.3f}" == shown[6]
            and f"{float(r['mt-bench/coding']):.3f}" == shown[10 + heads.index("coding")]
        )
        assert r["thinking"] == shown[5] and r["where"] == "offline" and r["drafter"] == "dflash"


def test_the_csv_neutralises_cells_a_spreadsheet_would_run(
    results: list[tuple[dict[str, Any], dict[str, Any]]], client: TestClient
) -> None:
    """An input file or a target named like a formula is text in the CSV (OWASP's rule: a quote first);
    numbers, negative ones too, stay numbers."""
    from app.store.db import get_engine

    params, result = results[0]
    named = {**params, "inputs": ["/data/=1+1"], "target": "@SUM(A1)"}
    result = {**result, "eval": {k: v for k, v in result["eval"].items() if k not in ("suites", "target")}}
    with Session(get_engine(), expire_on_commit=False) as s:
        s.add(Job(kind="eval", params=named, status="succeeded", queue="gpu", result=result))
        s.commit()
    got = list(csv.DictReader(io.StringIO(client.get("/evals.csv").text)))
    assert (got[0]["prompts"], got[0]["target"]) == ("'=1+1", "'@SUM(A1)")
    assert not any(v.startswith(("=", "+", "@")) for row in got for v in row.values())
    assert float(got[0]["tau"]) > 1  # a number stays a number
