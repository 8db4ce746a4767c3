"""A server listening beyond loopback, in Chromium: every page asks to sign in first, a wrong token
is said to be wrong, the right one comes back to the page asked for, and live parts keep polling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.browser.harness import GOOD_ROW, Server

TOKEN = "s3cret-token"


def test_reads_beyond_loopback_ask_to_sign_in_first(browser: Any, tmp_path: Path, watch: Any) -> None:
    server = Server(tmp_path / "home", extra_env={"DRAFTDECK_TOKEN": TOKEN}, host="0.0.0.0").start()
    context = browser.new_context(base_url=server.url)
    try:
        (server.data_dir / "a.jsonl").write_text(GOOD_ROW + "\n")
        job_id = server.submit(
            "scan", inputs=str(server.data_dir / "a.jsonl")
        )  # over the API, with the bearer
        page = context.new_page()
        page.on("dialog", lambda d: (watch.dialogs.append(d.message), d.dismiss()))
        page.goto(f"/jobs/{job_id}")
        page.wait_for_url("**/login?next=*")
        expect(page.locator("main h1")).to_have_text("Sign in")
        assert "a.jsonl" not in page.content()  # nothing of the job before sign-in
        page.fill("input[name=token]", "wrong")
        page.click("main form button[type=submit]")
        expect(page.locator("#login-error")).to_contain_text("that token is wrong")
        page.fill("input[name=token]", TOKEN)
        page.click("main form button[type=submit]")
        page.wait_for_url(f"**/jobs/{job_id}")
        expect(page.locator("#job-status")).to_have_text("succeeded")
        page.goto("/datasets")
        expect(page.locator("main h1")).to_contain_text("Datasets")
        assert watch.dialogs == []
    finally:
        context.close()
        server.stop()
    assert "Traceback" not in server.log_text()
