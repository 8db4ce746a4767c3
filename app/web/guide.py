"""The guide: the documentation site (docs/, built by `mkdocs build` into site/ beside the package, as
`make up` does) served under /guide, and which of its pages explains each dashboard page, job kind and
issue code. Where the site is not built (an installed wheel, a checkout before `make up`), /guide says
how to build it and which Markdown file holds the page meanwhile."""

from __future__ import annotations

import mimetypes
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from app.settings import Settings
from app.web.deps import SettingsDep
from app.web.render import render
from draftdeck.issue_codes import CODES

router = APIRouter()

PREFIX = "/guide/"
# The dashboard's sections (base.html's `nav`) and the job kinds, each with the docs page about it.
NAV_PAGES = {
    "jobs": "jobs",
    "new": "jobs",
    "datasets": "browse",
    "runs": "train",
    "evals": "eval",
    "serving": "serving",
    "alerts": "troubleshooting",
}
KIND_PAGES = {
    "scan": "convert",
    "convert": "convert",
    "mix": "mix",
    "regenerate": "regenerate",
    "tokenize": "tokenize",
    "train": "train",
    "eval": "eval",
    "cache-hidden": "hidden_cache",
    "sweep": "sweep",
    "export-drafter": "serving",
    "tiny-target": "jobs",
}


def guide_url(nav: str | None = None, kind: str | None = None) -> str:
    """The guide's page about a job kind, else about a dashboard section, else its first page."""
    page = KIND_PAGES.get(kind or "") or NAV_PAGES.get(nav or "")
    return f"{PREFIX}{page}/" if page else PREFIX


def issue_url(code: str) -> str | None:
    """Where the guide says what an issue code means and what to do; None for a name that is no code."""
    return f"{PREFIX}troubleshooting/#{code}" if code in CODES else None


def site_dir(settings: Settings) -> Path | None:
    """The built site: DRAFTDECK_GUIDE_DIR, else site/ beside the package in a checkout (where
    `mkdocs build` writes it); None where there is none."""
    site = settings.guide_dir or Path(str(files("app"))).parent / "site"
    return site if (site / "index.html").is_file() else None


def _file_in(site: Path, path: str) -> Path | None:
    """The file or folder a /guide path names inside the site; never anything outside it."""
    target = (site / path).resolve()
    if not target.is_relative_to(site.resolve()):
        return None
    return target if target.is_file() or (target / "index.html").is_file() else None


@router.get("/guide", include_in_schema=False)
@router.get("/guide/{path:path}", include_in_schema=False)
def guide(request: Request, settings: SettingsDep, path: str = "") -> Response:
    site = site_dir(settings)
    if site is None:
        page = path.strip("/").split("/")[0] or "index"
        return render(request, "guide_missing.html", source=f"docs/{page}.md", status_code=404)
    found = _file_in(site, path)
    if found is None:
        raise HTTPException(404, f"the guide has no page {path!r}")
    if found.is_dir():  # a page: its links are relative to the folder, so the address must end in /
        if path and not path.endswith("/"):
            return RedirectResponse(f"{PREFIX}{path}/", status_code=307)
        found = found / "index.html"
    media = mimetypes.guess_type(found.name)[0] or "application/octet-stream"
    if media == "text/html":
        return HTMLResponse(found.read_text(encoding="utf-8"))
    return FileResponse(found, media_type=media)
