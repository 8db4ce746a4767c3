"""Sizes say their binary unit and counts agree with their noun, in the pages and the CLI alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftdeck.units import binary_size, count, duration, rate


@pytest.mark.parametrize(
    "n,text",
    [
        (None, "?"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (64 << 20, "64.0 MiB"),
        (3 << 40, "3.0 TiB"),
    ],
)
def test_binary_sizes_say_so(n: int | None, text: str) -> None:
    assert binary_size(n) == text


@pytest.mark.parametrize(
    "n,noun,text",
    [(1, "rows", "1 row"), (1, "chunks", "1 chunk"), (0, "rows", "0 rows"), (2, "row", "2 rows"),
     (12_000, "tokens", "12,000 tokens"), (1, "bytes", "1 byte"), (3, "entry", "3 entries"),
     (1, "status", "1 status"), (2, "status", "2 statuses"), (2, "batch", "2 batches")],
)  # fmt: skip
def test_counts_agree_with_their_noun(n: int, noun: str, text: str) -> None:
    assert count(n, noun) == text


def test_durations_and_rates() -> None:
    assert [duration(s) for s in (0.25, 4.21, 200, 7500)] == ["250 ms", "4.2 s", "3 min 20 s", "2 h 5 min"]
    assert rate(1.5 * 1024 * 1024, "bytes") == "1.5 MiB/s"
    assert [rate(r, "rows") for r in (350.4, 2.5, 0.5)] == ["350 rows/s", "2.5 rows/s", "30.0 rows/min"]


def test_pages_use_them_and_link_a_favicon(migrated: Path) -> None:
    from fastapi.testclient import TestClient

    from app.store import records
    from app.store.db import session_scope
    from app.store.models import JobStatus
    from app.web.main import create_app

    with session_scope() as s:
        job = records.create_job(s, "scan", {"inputs": ["x"], "max_row_bytes": 64 << 20}, "cpu")
        job.status, job.progress_done, job.progress_total = JobStatus.SUCCEEDED, 1, 1
        s.add(job)
        s.commit()
    with TestClient(create_app()) as client:
        page = client.get(f"/jobs/{job.id}").text
        assert '<span title="67,108,864 bytes">64.0 MiB</span>' in page and "MB (" not in page
        assert "1 rows" not in page and "1 row" in page
        assert '<link rel="icon" href="/static/favicon.svg"' in page
        icon = client.get("/static/favicon.svg")
        assert icon.status_code == 200 and icon.text.startswith("<svg")
