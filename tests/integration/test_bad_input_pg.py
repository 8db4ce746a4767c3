"""The bad-input cases of tests/app/web/test_bad_input.py on PostgreSQL, where ids are 32-bit columns
and text refuses NUL: every one is a 4xx there too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.app.web.test_bad_input import check_ids, check_text, make_client

pytestmark = [pytest.mark.services]


@pytest.fixture
def pg_client(dd_home: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    from app.settings import get_settings
    from app.store.db import get_engine, upgrade

    monkeypatch.setenv("DATABASE_URL", pg_url)
    get_settings.cache_clear()
    get_engine.cache_clear()
    upgrade()
    yield from make_client(dd_home)
    get_engine().dispose()


def test_huge_ids_are_4xx_on_postgresql(pg_client: TestClient) -> None:
    check_ids(pg_client)


def test_nul_surrogates_and_long_names_are_4xx_on_postgresql(pg_client: TestClient) -> None:
    check_text(pg_client)
