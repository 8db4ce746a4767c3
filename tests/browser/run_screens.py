"""Screenshots of the run pages at 1366 and 390 px wide, full height, to look at by eye.

    python -m tests.browser.run_screens            # writes var/screens/*.png (gitignored)
    python -m tests.browser.run_screens --out DIR

It starts its own `draftdeck up` with a scratch home and writes three runs into its database (one
running, one finished with checkpoints and an eval whose real tau is far from the walked tau, one
failed), then photographs the runs table, each run page, the comparison and the alerts page.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright
from sqlmodel import Session

from app.db import make_engine
from tests.browser.harness import REPO_ROOT, Server, launch_browser
from tests.run_helpers import make_eval, make_run

WIDTHS = {"desktop": (1366, 900), "narrow": (390, 844)}


def take(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    home = Path(tempfile.mkdtemp(prefix="dd-runs-")) / "home"
    server = Server(home).start()
    engine = make_engine(f"sqlite:///{home.resolve() / 'draftdeck.db'}")
    try:
        with Session(engine, expire_on_commit=False) as db:
            jobs = home / "jobs"
            done = make_run(db, jobs, steps=3000, status="succeeded", params={"lr": 3e-3}, seed=1)
            make_eval(db, jobs, done, 2000, real_tau=1.94, data_tau=2.37, target_tau=1.97)
            make_eval(db, jobs, done, 1000, real_tau=1.81, data_tau=1.83, target_tau=1.80)
            failed = make_run(db, jobs, steps=900, status="failed", params={"lr": 1e-2, "layers": 2}, seed=2)
            running = make_run(db, jobs, steps=400, status="running", seed=3)
        with sync_playwright() as pw:
            browser = launch_browser(pw)
            for name, url in [
                ("runs", "/runs"),
                ("run-done", f"/runs/{done}"),
                ("run-running", f"/runs/{running}"),
                ("compare", f"/runs/compare?ids={done}&ids={failed}"),
                ("alerts", "/alerts"),
            ]:
                for label, (w, h) in WIDTHS.items():
                    context = browser.new_context(base_url=server.url, viewport={"width": w, "height": h})
                    page = context.new_page()
                    page.goto(url)
                    if url.startswith("/runs/"):
                        page.wait_for_selector("#plot-loss canvas")
                    path = out / f"{name}-{label}.png"
                    page.screenshot(path=str(path), full_page=True)
                    shots.append(path)
                    if label == "narrow":  # the full page is too tall to read scaled down
                        for part in range(3):
                            page.evaluate(f"window.scrollTo(0, {part * h})")
                            shots.append(out / f"{name}-{label}-{part}.png")
                            page.screenshot(path=str(shots[-1]))
                    context.close()
            browser.close()
    finally:
        engine.dispose()
        server.stop()
        shutil.rmtree(home.parent, ignore_errors=True)
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "var" / "screens")
    args = parser.parse_args()
    for path in take(args.out):
        print(path)


if __name__ == "__main__":
    main()
