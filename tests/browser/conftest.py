"""Browser fixtures: one real `draftdeck up` for the session, Debian's Chromium, and a page that records
dialogs, console errors, CSP violations and server tracebacks, and fails the test on any of them."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.browser.harness import CHROMIUM, Server, SlowFile, launch_browser

sync_api = pytest.importorskip("playwright.sync_api")

if not os.path.exists(CHROMIUM):  # pragma: no cover - depends on the machine
    pytest.skip(f"{CHROMIUM} is absent (apt-get install chromium)", allow_module_level=True)

_names = itertools.count(1)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`draftdeck up --port <free>` with a fresh home; its whole process group is stopped at the end."""
    srv = Server(tmp_path_factory.mktemp("dd") / "home").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = launch_browser(pw)
        try:
            yield b
        finally:
            b.close()


@dataclass
class Watch:
    """What the browser and the server said while a test ran."""

    dialogs: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    def csp_violations(self) -> list[str]:
        return [m for m in self.console_errors if "Content Security Policy" in m or "Refused to" in m]

    def script_errors(self) -> list[str]:
        # "Failed to load resource: ... 400" is the browser noting an HTTP error page we asked for.
        return self.page_errors + [m for m in self.console_errors if "Failed to load resource" not in m]


@pytest.fixture
def watch() -> Watch:
    return Watch()


@pytest.fixture
def page(browser: Any, server: Server, watch: Watch, request: pytest.FixtureRequest) -> Iterator[Any]:
    sync_api.expect.set_options(timeout=10_000)
    context = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(10_000)

    def on_dialog(dialog: Any) -> None:
        watch.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    pg.on("dialog", on_dialog)
    pg.on(
        "console", lambda m: watch.console_errors.append(m.text) if m.type in ("error", "warning") else None
    )
    pg.on("pageerror", lambda e: watch.page_errors.append(str(e)))
    log_start = len(server.log_text())
    try:
        yield pg
    finally:
        context.close()
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.failed:
        return
    new_log = server.log_text()[log_start:]
    assert "Traceback" not in new_log, f"the server logged a traceback during the test:\n{new_log[-4000:]}"
    assert watch.dialogs == [], f"a dialog fired: {watch.dialogs}"
    assert watch.csp_violations() == [], f"CSP violations: {watch.csp_violations()}"
    assert watch.script_errors() == [], f"script errors: {watch.script_errors()}"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep


@pytest.fixture
def data_file(server: Server) -> Any:
    """Write rows (dicts, or raw strings for bad lines) to a fresh file under the server's data dir."""

    def write(rows: list[Any], name: str | None = None) -> Path:
        path = server.data_dir / (name or f"t{next(_names)}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")
        return path

    return write


@pytest.fixture
def slow_file(server: Server) -> Iterator[Any]:
    """Named pipes in the data dir; every one is closed at teardown so the worker never stays blocked."""
    made: list[SlowFile] = []

    def make(name: str | None = None) -> SlowFile:
        f = SlowFile(server.data_dir / (name or f"slow{next(_names)}.jsonl"))
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in this folder is a browser test (`-m browser` / `-m "not browser"` split the run:
    see the Makefile), whether or not its module says so."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)
