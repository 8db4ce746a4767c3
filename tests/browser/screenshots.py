"""Screenshots of the job pages, desktop (1280 wide) and narrow (390 wide), to look at by eye.

    python -m tests.browser.screenshots            # writes var/screenshots/*.png (gitignored)
    python -m tests.browser.screenshots --out DIR

It starts its own `draftdeck up` with a scratch home, fills it with a few jobs (a succeeded scan of a
file deep in a long path, with rejected rows; a failed scan of an empty file; a job still running on a
named pipe), then photographs each page at both widths, full height.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from tests.browser.harness import REAL_DATA, REPO_ROOT, Server, SlowFile, launch_browser

WIDTHS = {"desktop": (1280, 800), "narrow": (390, 844)}


def _fill(server: Server) -> dict[str, Any]:
    """Create the jobs the pages will show; return their ids."""
    deep = server.data_dir / "team-drafters" / "qwen3-8b-regenerated-2026-11-30" / "ultrachat"
    deep.mkdir(parents=True)
    good = deep / "ultrachat_messages_regenerated_by_target_temperature_0_max_tokens_4096.jsonl"
    real = REAL_DATA / "LLaMA-Factory__v1_sft_demo.jsonl"
    lines = (
        real.read_text().splitlines()
        if real.exists()
        else [
            json.dumps(
                {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
            )
            for i in range(40)
        ]
    )
    extra = [
        json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}),
        '{"messages": [{"role": "user", "content": "cut off',
        "[1, 2, 3]",
        "\ufffd\ufffd not json at all",
    ]
    good.write_text("\n".join(lines + extra) + "\n")
    empty = server.data_dir / "exports" / "sharegpt_export_that_came_out_empty.jsonl"
    empty.parent.mkdir()
    empty.write_text("")
    ids = {"succeeded": server.submit("scan", inputs=str(good))}
    server.wait_status(ids["succeeded"])
    ids["failed"] = server.submit("scan", inputs=str(empty))
    server.wait_status(ids["failed"])
    return ids


def take(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    home = Path(tempfile.mkdtemp(prefix="dd-shots-")) / "home"
    server = Server(home).start()
    pipe: SlowFile | None = None
    try:
        with sync_playwright() as pw:
            browser = launch_browser(pw)

            def snap(name: str, url: str, *, fill: dict[str, str] | None = None) -> None:
                for label, (w, h) in WIDTHS.items():
                    context = browser.new_context(base_url=server.url, viewport={"width": w, "height": h})
                    page = context.new_page()
                    page.goto(url)
                    if fill:
                        for field, value in fill.items():
                            if not page.locator(f"#new-job [name={field}]").is_visible():
                                page.click("#advanced > summary")
                            page.fill(f"#new-job [name={field}]", value)
                        page.click("#new-job button[type=submit]")
                        page.wait_for_load_state()
                    path = out / f"{name}-{label}.png"
                    page.screenshot(path=str(path), full_page=True)
                    shots.append(path)
                    context.close()

            snap("jobs-empty", "/jobs")
            snap("job-new", "/jobs/new")
            for kind in server.api("GET", "/api/kinds"):
                if kind != "scan":
                    snap(f"job-new-{kind}", f"/jobs/new?kind={kind}")
            snap("job-new-error", "/jobs/new", fill={"inputs": "/etc/passwd"})
            ids = _fill(server)
            (server.data_dir / "incoming").mkdir()
            pipe = SlowFile(server.data_dir / "incoming" / "streaming_from_generator.jsonl")
            running = server.submit("scan", inputs=str(pipe.path))
            pipe.open()
            pipe.write_rows([{"prompt": f"q{i}"} for i in range(100)])
            server.wait_status(running, ("running",))
            snap("jobs-list", "/jobs")
            snap("job-running", f"/jobs/{running}")
            snap("job-succeeded", f"/jobs/{ids['succeeded']}")
            snap("job-failed", f"/jobs/{ids['failed']}")
            snap("alerts", "/alerts")
            snap("error-404", "/jobs/987654")
            snap("login", "/login")
            pipe.close()
            server.wait_status(running)
            browser.close()
    finally:
        if pipe is not None:
            pipe.close()
        server.stop()
        shutil.rmtree(home.parent, ignore_errors=True)
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "var" / "screenshots")
    args = parser.parse_args()
    for path in take(args.out):
        print(path)


if __name__ == "__main__":
    main()
