"""The New job form's memory plan for a train job: per rank for each sharding, from the target in
the data roots; a path outside them is refused in words, as every path over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import FIXTURES


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def test_the_form_plans_a_train_job_from_the_target_config(client: TestClient, migrated: Path) -> None:
    target = migrated / "data" / "qwen3-8b"
    target.mkdir()
    (target / "config.json").write_bytes((FIXTURES / "configs/qwen3-8b.json").read_bytes())
    page = client.get("/jobs/new?kind=train")
    assert 'id="train-plan"' in page.text and 'hx-get="/jobs/new/plan"' in page.text
    shown = client.get(
        "/jobs/new/plan", params={"target": str(target), "devices": "8", "layers": "5", "seq_length": "2048"}
    )
    assert shown.status_code == 200
    assert "8.19B parameters" in shown.text and "rows of 2,048 tokens" in shown.text
    assert '<th scope="row">per rank</th>' in shown.text and "<strong>ddp</strong>" in shown.text
    assert "fits" not in shown.text.split("</table>")[0]  # no GPU here: terms, no verdict
    assert "give the target" in client.get("/jobs/new/plan").text
    eagle3 = client.get("/jobs/new/plan", params={"target": str(target), "drafter": "eagle3"}).text
    assert "the plan models DFlash drafters" in eagle3 and 'id="plan-table"' not in eagle3  # no DFlash plan
    outside = client.get("/jobs/new/plan", params={"target": "/etc"})
    assert "/etc: outside the data roots" in outside.text, outside.text
    assert "<script" not in client.get("/jobs/new/plan", params={"target": "<script>x</script>"}).text
