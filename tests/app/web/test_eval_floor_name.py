"""The eval page names its floor line as the kind does: an MTP eval's `untrained` line is the target's
MTP layer as it ships ("untouched MTP head"), every other kind's a freshly initialised drafter."""

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


def _eval_job(drafter: str) -> int:
    from app.store.db import get_engine
    from app.store.models import Job

    figures = {"tau_incl_bonus_pooled": 2.0, "tau_incl_bonus_per_response_mean": 2.0, "tokens_per_step": 2.0,
               "acceptance_rate": 0.4, "tokens_per_s": 30.0, "speedup_vs_target_only": 0.6,
               "lossless": True}  # fmt: skip
    walked = {"tau_incl_bonus": 2.0, "relative_gap_to_real": 0.0}
    ev: dict[str, Any] = {"block_size": 8, "drafter": drafter, "mode": "greedy", "walked": walked,
                          "methods": {"drafter": figures,
                                      "untrained": {**figures, "tau_incl_bonus_pooled": 1.4}}}  # fmt: skip
    result = {"rows_in": 4, "rows_out": 4, "rejected": {}, "warnings": {}, "eval": ev}
    with Session(get_engine(), expire_on_commit=False) as s:
        job = Job(kind="eval", params={}, status="succeeded", queue="gpu", result=result)
        s.add(job)
        s.commit()
        assert job.id is not None
        return job.id


@pytest.mark.parametrize(("drafter", "floor"), [("mtp", "untouched MTP head"), ("eagle3", "untrained")])
def test_the_floor_line_is_named_by_the_kind(client: TestClient, drafter: str, floor: str) -> None:
    page = client.get(f"/jobs/{_eval_job(drafter)}", headers={"accept": "text/html"}).text
    table = page.split('id="eval-methods"', 1)[1].split("</table>", 1)[0]
    rows = [r.split("</td>", 1)[0] for r in table.split("<tr><td>")[1:]]
    assert rows == ["drafter", floor]
