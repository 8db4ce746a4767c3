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
    assert "DFlash drafter (5 layers): 1.05B trainable" in shown.text
    # an EAGLE-3 form gets EAGLE-3's plan: one layer over the draft vocabulary, its own count
    eagle3 = client.get(
        "/jobs/new/plan", params={"target": str(target), "drafter": "eagle3", "draft_vocab_size": "16000"}
    ).text
    assert "EAGLE-3 drafter, 7 TTT steps over 16,000 draft ids" in eagle3 and 'id="plan-table"' in eagle3
    assert "EAGLE-3 drafter" not in shown.text and "334.0M trainable" in eagle3  # test_plan counts it
    outside = client.get("/jobs/new/plan", params={"target": "/etc"})
    assert "/etc: outside the data roots" in outside.text, outside.text
    assert "<script" not in client.get("/jobs/new/plan", params={"target": "<script>x</script>"}).text


def _target_weights(page: str) -> str:
    return page.split('<th scope="row">target weights</th>')[1].split("</tr>")[0]


def test_the_form_plans_a_run_from_a_hidden_state_cache(client: TestClient, migrated: Path) -> None:
    """With hidden_states (or hidden_states_cache) filled in: the target's embedding and head alone,
    no fsdp column."""
    target = migrated / "data" / "qwen3-8b"
    target.mkdir()
    (target / "config.json").write_bytes((FIXTURES / "configs/qwen3-8b.json").read_bytes())
    shape = {"target": str(target), "devices": "2", "seq_length": "2048"}
    online = client.get("/jobs/new/plan", params=shape).text
    assert "from the hidden-state cache" not in online and '<th scope="col">fsdp</th>' in online
    for field in ("hidden_states", "hidden_states_cache"):
        cached = client.get("/jobs/new/plan", params={**shape, field: "caches/c"}).text
        assert "from the hidden-state cache" in cached and '<th scope="col">fsdp</th>' not in cached
        # float32 on this GPU-less server: 151,936 x 4,096 x 2 (untied) x 4 bytes = 4.64 GiB a rank
        assert _target_weights(cached).count("<td>4.6 GiB</td>") == 2, _target_weights(cached)
        assert "4.6 GiB" not in _target_weights(online)
