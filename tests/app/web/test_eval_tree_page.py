"""An eval verified with draft trees says so on its page: the tree in the heading and in the τ line,
the verified tokens per step beside τ, and which of the figures carries over to a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session


@pytest.fixture
def client(migrated: Path) -> TestClient:
    from app.web.main import create_app

    return TestClient(create_app())


def _eval_job(ev: dict[str, Any]) -> int:
    from app.store.db import get_engine
    from app.store.models import Job

    result = {"rows_in": 4, "rows_out": 4, "rejected": {}, "warnings": {}, "eval": ev}
    with Session(get_engine(), expire_on_commit=False) as s:
        job = Job(kind="eval", params={}, status="succeeded", queue="gpu", result=result)
        s.add(job)
        s.commit()
        assert job.id is not None
        return job.id


def _figures(tau: float, verified: float) -> dict[str, Any]:
    return {"tau_incl_bonus_pooled": tau, "tau_incl_bonus_per_response_mean": tau, "tokens_per_step": tau,
            "acceptance_rate": 0.4, "tokens_per_s": 30.0, "speedup_vs_target_only": 0.6, "lossless": True,
            "verified_per_step": verified}  # fmt: skip


def test_a_tree_eval_names_its_tree_and_the_verified_tokens_per_step(client: TestClient) -> None:
    walked = {"tau_incl_bonus": 3.0, "relative_gap_to_real": 0.1}
    common = {"block_size": 8, "drafter": "dflash", "mode": "greedy", "walked": walked,
              "conventions": "Two counts of one decode."}  # fmt: skip
    tree = _eval_job({**common, "methods": {"drafter": _figures(3.9, 17.0)},
                      "tree": {"budget": 16, "topk": 4, "depth": 7},
                      "tree_label": "trees of 16 nodes (top-4, depth 7)"})  # fmt: skip
    page = client.get(f"/jobs/{tree}", headers={"accept": "text/html"}).text
    assert "DFlash, blocks of 8 (7 drafts), verified as trees of 16 nodes (top-4, depth 7), greedy" in page
    table = page.split('id="eval-methods"', 1)[1].split("</table>", 1)[0]
    assert "verified / step" in table and '<td class="num">17.0</td>' in table
    line = page.split('id="tau-conventions">', 1)[1].split("</p>", 1)[0]
    assert "measured verifying trees of 16 nodes (top-4, depth 7) per step" in line
    assert "τ and verified / step carry over to it and tokens/s does not" in line
    assert "a chain&#39;s walk" in page or "a chain's walk" in page
    # an eval from before the count: a dash, and no tree named
    chain = _eval_job(
        {
            **common,
            "methods": {"drafter": {k: v for k, v in _figures(3.1, 0.0).items() if k != "verified_per_step"}},
        }
    )
    old = client.get(f"/jobs/{chain}", headers={"accept": "text/html"}).text
    table = old.split('id="eval-methods"', 1)[1].split("</table>", 1)[0]
    assert (
        "verified as" not in old
        and "measured verifying" not in old
        and ('<td class="num">3.100</td>\n    <td class="num">\u2013</td>' in table)
    )
