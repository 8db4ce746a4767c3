"""What the screenshot scripts (run_screens, serving_screens) share: photograph pages of a running
`draftdeck up` at a desktop and a phone width, full height, and their command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from tests.browser.harness import REPO_ROOT, launch_browser

WIDTHS = {"desktop": (1366, 900), "narrow": (390, 844)}
# (name, width label, page) -> None: wait for what must be drawn; or -> paths of more shots taken
Ready = Callable[[str, Any], None]
More = Callable[[str, str, Any, Path], list[Path]]


def photograph(
    base_url: str, pages: Sequence[tuple[str, str]], out: Path, ready: Ready | None = None,
    more: More | None = None,
) -> list[Path]:  # fmt: skip
    """`<out>/<name>-<width>.png` of every (name, url), each in a fresh browser context."""
    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    with sync_playwright() as pw:
        browser = launch_browser(pw)
        for name, url in pages:
            for label, (w, h) in WIDTHS.items():
                context = browser.new_context(base_url=base_url, viewport={"width": w, "height": h})
                page = context.new_page()
                page.goto(url)
                if ready is not None:
                    ready(name, page)
                path = out / f"{name}-{label}.png"
                page.screenshot(path=str(path), full_page=True)
                shots.append(path)
                if more is not None:
                    shots += more(name, label, page, out)
                context.close()
        browser.close()
    return shots


def main(doc: str, take: Callable[[Path], list[Path]]) -> None:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "var" / "screens")
    for path in take(parser.parse_args().out):
        print(path)
