"""Screenshots of the run pages at 1366 and 390 px wide, full height, to look at by eye.

    python -m tests.browser.run_screens            # writes var/screens/*.png (gitignored)
    python -m tests.browser.run_screens --out DIR

It starts its own `draftdeck up` with a scratch home and writes three runs into its database (one
running, one finished with checkpoints and an eval whose real tau is far from the walked tau, one
failed), then photographs the runs table, each run page, the comparison and the alerts page.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from sqlmodel import Session

from app.store.db import make_engine
from tests.browser.harness import Server
from tests.browser.photos import WIDTHS, main, photograph
from tests.support.run import make_eval, make_run


def _ready(name: str, page: Any) -> None:
    if name.startswith(("run-", "compare")):
        page.wait_for_selector("#plot-loss canvas")


def _parts(name: str, label: str, page: Any, out: Path) -> list[Path]:
    """The narrow page is too tall to read scaled down: three screens of it as well."""
    if label != "narrow":
        return []
    shots = []
    for part in range(3):
        page.evaluate(f"window.scrollTo(0, {part * WIDTHS[label][1]})")
        shots.append(out / f"{name}-{label}-{part}.png")
        page.screenshot(path=str(shots[-1]))
    return shots


def take(out: Path) -> list[Path]:
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
        pages = [("runs", "/runs"), ("run-done", f"/runs/{done}"), ("run-running", f"/runs/{running}"),
                 ("compare", f"/runs/compare?ids={done}&ids={failed}"), ("alerts", "/alerts")]  # fmt: skip
        return photograph(server.url, pages, out, _ready, _parts)
    finally:
        engine.dispose()
        server.stop()
        shutil.rmtree(home.parent, ignore_errors=True)


if __name__ == "__main__":
    main(__doc__ or "", take)
