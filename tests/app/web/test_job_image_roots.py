"""A convert job submitted over HTTP reads image files only from the data roots: a row naming one
outside them (a path, or a link inside a root pointing out) is rejected as `image_outside_roots`, and
nothing of that file reaches the output's images/ folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from fastapi.testclient import TestClient

from tests.unit.formats.imaging import write_image


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def test_a_served_convert_copies_no_image_from_outside_the_roots(
    client: TestClient, migrated: Path, tmp_path: Path
) -> None:
    from app.run.job import run_job

    data = migrated / "data"  # the home is a data root; tmp_path's other folders are not
    inside = write_image(data / "imgs" / "a.png", (200, 30, 40))
    secret = write_image(tmp_path / "elsewhere" / "secret.png", (1, 2, 3))
    (data / "link.png").symlink_to(secret)
    images = ["imgs/a.png", "imgs/a.png", "imgs/a.png", str(secret), "link.png"]

    def row(i: int, image: str) -> dict[str, object]:
        turns = [{"from": "human", "value": f"<image>picture {i}?"}, {"from": "gpt", "value": "A."}]
        return {"conversations": turns, "images": [image]}

    rows = [row(i, image) for i, image in enumerate(images)]
    (data / "rows.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))

    r = client.post(
        "/api/jobs", json={"kind": "convert", "params": {"inputs": "data/rows.jsonl", "to": "sharegpt"}}
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert run_job(job_id) == "succeeded"
    job = client.get(f"/api/jobs/{job_id}").json()
    result = job["result"]
    assert (result["rows_out"], result["rejected"]) == (3, {"image_outside_roots": 2})
    [out] = [Path(o["path"]) for o in result["outputs"]]
    stored = [p.read_bytes() for p in (out.parent / "images").iterdir()]
    assert stored == [inside.read_bytes()]
    # the report names each row's path, and the roots it was confined to
    reasons = [e["reason"] for e in result["examples"]["image_outside_roots"]]
    assert [str(secret) in why and str(migrated) in why for why in reasons] == [True, True], reasons
    assert "link.png (it resolves to" in reasons[1]
