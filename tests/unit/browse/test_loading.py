"""Stores and tokenizers under load: each loaded once per process (single flight) in a bounded cache,
and a fresh `draftdeck web` answering 50 concurrent first requests to sample pages (issue 12)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from draftdeck.browse.loading import LoadOnce
from tests.support.datasets import build_chat_dataset, web_server


def test_concurrent_misses_share_one_load_and_the_cache_is_bounded() -> None:
    started = threading.Event()
    calls: list[str] = []

    def slow_load(key: str) -> str:
        calls.append(key)
        started.set()
        time.sleep(0.2)
        return key.upper()

    cache: LoadOnce[str, str] = LoadOnce(slow_load, size=2)
    barrier = threading.Barrier(20)

    def get(_: int) -> str:
        barrier.wait()
        return cache.get("a")

    with ThreadPoolExecutor(max_workers=20) as pool:
        assert list(pool.map(get, range(20))) == ["A"] * 20
    assert calls == ["a"] and cache.loads == 1
    cache.get("b")
    cache.get("c")  # evicts "a", the least recently used
    cache.get("a")
    assert calls == ["a", "b", "c", "a"]
    cache.get("a", version=2)  # the files changed: loaded again
    assert calls[-1] == "a" and cache.loads == 5


def test_a_failed_load_is_not_cached() -> None:
    attempts: list[int] = []

    def flaky(key: str) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("first try fails")
        return key

    cache: LoadOnce[str, str] = LoadOnce(flaky, size=4)
    with pytest.raises(ValueError, match="first try fails"):
        cache.get("x")
    assert cache.get("x") == "x" and len(attempts) == 2


def test_one_store_per_dataset_for_concurrent_first_readers(tmp_path: Path) -> None:
    from draftdeck.browse import loading
    from tests.support.datasets import write_dataset

    rows = [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}] * 5
    folder = write_dataset(tmp_path / "ds", rows, None)
    before = loading._stores.loads
    barrier = threading.Barrier(16)

    def open_it(_: int) -> int:
        barrier.wait()
        return id(loading.open_store(folder))

    with ThreadPoolExecutor(max_workers=16) as pool:
        assert len(set(pool.map(open_it, range(16)))) == 1
    assert loading._stores.loads == before + 1
    first = loading.open_store(folder)
    stamp = (folder / "manifest.json").stat().st_mtime_ns + 10**9
    os.utime(folder / "manifest.json", ns=(stamp, stamp))  # rewritten: the next reader gets a fresh store
    assert loading.open_store(folder) is not first and loading.open_store(folder) is loading.open_store(
        folder
    )
    assert loading._stores.loads == before + 2


@pytest.mark.slow
def test_fifty_concurrent_first_requests_to_a_fresh_server_all_succeed(migrated: Path) -> None:
    """Right after start, 50 readers of sample pages at once: every answer is the page (no 404 from an
    import race, no 500 from an exhausted pool, no traceback in the log)."""
    from app.store.dataset_records import add_datasets, found_at
    from app.store.db import session_scope

    made = build_chat_dataset(migrated, max_len=40)
    with session_scope() as s:  # registered before the server starts: its first request loads everything
        [ds] = add_datasets(s, [found_at(made["dataset"])], job_id=None)
        s.commit()
        ds_id = ds.id
    with web_server(migrated, migrated, migrated.parent / "web.log") as url:
        barrier = threading.Barrier(50)

        def read(i: int) -> tuple[int, str]:
            with httpx.Client(base_url=url, timeout=120) as c:
                barrier.wait()
                r = c.get(f"/datasets/{ds_id}/rows/{i % 5}")
                return r.status_code, r.text

        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(read, range(50)))
    bad = [(code, text[-300:]) for code, text in answers if code != 200 or 'id="chips-main"' not in text]
    assert not bad, bad[:3]
    assert all("cannot import" not in text for _, text in answers)
    assert "Traceback" not in (migrated.parent / "web.log").read_text(errors="replace")
