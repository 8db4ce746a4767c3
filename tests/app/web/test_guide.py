"""/guide: the documentation site served beside the dashboard, each page's Guide link, and each issue
code's link to what it means and what to do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.web.guide import KIND_PAGES, NAV_PAGES, guide_url, issue_url
from draftdeck.issue_codes import CODES
from draftdeck.kinds import KINDS
from tests.conftest import REPO_ROOT


def _client(migrated: Path, monkeypatch: pytest.MonkeyPatch, site: Path) -> Iterator[TestClient]:
    from app.settings import get_settings
    from app.web.main import create_app

    monkeypatch.setenv("DRAFTDECK_GUIDE_DIR", str(site))
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A built site's shape: pages are folders with an index.html, assets beside them."""
    site = tmp_path / "site"
    for page in ("", "train/", "troubleshooting/"):
        (site / page).mkdir(parents=True, exist_ok=True)
        (site / page / "index.html").write_text(f"<h1>page {page or 'home'}</h1><script>var x=1</script>")
    (site / "assets").mkdir()
    (site / "assets" / "app.css").write_text("body{}")
    (tmp_path / "secret.txt").write_text("not the guide's")
    return site


@pytest.fixture
def client(migrated: Path, monkeypatch: pytest.MonkeyPatch, site: Path) -> Iterator[TestClient]:
    yield from _client(migrated, monkeypatch, site)


def test_every_section_and_job_kind_has_its_guide_page() -> None:
    assert set(KIND_PAGES) == set(KINDS)
    pages = set(NAV_PAGES.values()) | set(KIND_PAGES.values())
    assert [p for p in sorted(pages) if not (REPO_ROOT / "docs" / f"{p}.md").is_file()] == []
    assert guide_url("new", "tokenize") == "/guide/tokenize/"  # the kind's page before the section's
    assert guide_url("runs") == "/guide/train/"
    assert guide_url(None) == "/guide/"


def test_the_guide_serves_the_built_site_and_nothing_beside_it(client: TestClient) -> None:
    r = client.get("/guide/train", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/guide/train/"  # its relative links need the /
    r = client.get("/guide/train/")
    assert r.status_code == 200 and "page train/" in r.text
    assert "script-src 'self' 'unsafe-inline'" in r.headers["content-security-policy"]  # Material's scripts
    assert client.get("/guide/").text.startswith("<h1>page home")
    css = client.get("/guide/assets/app.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    for outside in ("/guide/..%2Fsecret.txt", "/guide/%2e%2e/secret.txt", "/guide/nope/"):
        r = client.get(outside)
        assert r.status_code == 404 and "not the guide's" not in r.text, outside
    # the dashboard keeps its strict policy, and its pages link to the guide's page about them
    jobs = client.get("/jobs")
    assert "script-src 'self';" in jobs.headers["content-security-policy"]
    assert 'href="/guide/jobs/"' in jobs.text
    assert 'href="/guide/tokenize/"' in client.get("/jobs/new?kind=tokenize").text


def test_without_a_built_site_the_guide_says_how_to_build_it(
    migrated: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for c in _client(migrated, monkeypatch, tmp_path / "unbuilt"):
        r = c.get("/guide/train/", headers={"accept": "text/html"})
        assert r.status_code == 404
        assert "mkdocs build" in r.text and "docs/train.md" in r.text


def test_issue_codes_link_to_their_entry_in_the_guide() -> None:
    assert issue_url("json_error") == "/guide/troubleshooting/#json_error"
    assert issue_url("<script>") is None  # only known codes become links
    built = REPO_ROOT / "site" / "troubleshooting" / "index.html"
    if not built.is_file():
        pytest.skip("site/ is not built (make test builds it before the tests)")
    page = built.read_text()
    assert [code for code in CODES if f'id="{code}"' not in page] == []


def test_the_guide_leads_back_to_the_dashboard() -> None:
    """The guide had no way back to the dashboard that serves it: its logo and its nav's first entry
    link to the dashboard's root."""
    built = REPO_ROOT / "site" / "train" / "index.html"
    if not built.is_file():
        pytest.skip("site/ is not built (make test builds it before the tests)")
    page = built.read_text()
    assert 'href="/" title="DraftDeck" class="md-header__button md-logo"' in page
    back = page.split('<a href="/" class="md-nav__link">', 1)[1].split("</a>", 1)[0]
    assert "Back to the dashboard" in back
    assert page.index("Back to the dashboard") < page.index("Getting started")
