"""Screenshots of the serving pages at 1366 and 390 px wide, to look at by eye.

    python -m tests.browser.serving_screens            # writes var/screens/serving-*.png (gitignored)

It starts its own `draftdeck up` with a scratch home, a run with an eval, and three stand-in servers
(tests/support/serving.py): a vLLM one serving the run below its eval tau, one that answers garbage,
and an SGLang one; the server's own scraper reads them for a few seconds before the photographs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlmodel import Session

from app.serving import endpoints
from app.store.db import make_engine
from tests.browser.harness import Server
from tests.browser.photos import main, photograph
from tests.support.run import make_eval, make_run
from tests.support.serving import SglangStandIn, VllmStandIn
from tests.support.serving import serving as serve


def _ready(name: str, page: Any) -> None:
    if name in ("serving-run", "serving-endpoint"):  # the served charts drawn
        page.wait_for_selector("[data-plot=tau][data-points]", timeout=10_000)


def _served_part(name: str, label: str, page: Any, out: Path) -> list[Path]:
    """The run page is long: its Served section alone as well."""
    if name != "serving-run":
        return []
    path = out / f"{name}-{label}-served.png"
    page.locator("section.served").first.screenshot(path=str(path))
    return [path]


def take(out: Path) -> list[Path]:
    home = Path(tempfile.mkdtemp(prefix="dd-serving-")) / "home"
    server = Server(home).start()
    engine = make_engine(f"sqlite:///{home.resolve() / 'draftdeck.db'}")
    vllm, sglang = VllmStandIn(k=3, engines=("0", "1"), model="qwen"), SglangStandIn()
    sglang.length.labels("qwen").set(3.41)
    sglang.rate.labels("qwen").set(0.34)
    try:
        with (
            serve(vllm.text) as good, serve(lambda: "<html><body>502 Bad Gateway</body></html>") as bad,
            serve(sglang.text) as sg, Session(engine, expire_on_commit=False) as db,
        ):  # fmt: skip
            jobs = home / "jobs"
            run = make_run(db, jobs, steps=3000, status="succeeded", seed=1)
            make_eval(db, jobs, run, 2900, real_tau=3.9, data_tau=4.0, target_tau=3.95, per_pos=[97, 93, 90])
            for name, url, kind in (("prod-qwen-dflash", good.url, "vllm"), ("staging", bad.url, "vllm"),
                                    ("sglang-canary", sg.url, "sglang")):  # fmt: skip
                endpoints.create_endpoint(db, name=name, kind=kind, metrics_url=url, interval_s=1,
                                        run_job_id=run, drafter="models/drafter")  # fmt: skip
            for _ in range(25):  # ~5 s: the server's scraper takes its windows
                vllm.decode("qwen", "0", [3, 3, 2, 0, 3, 1, 2, 3] * 40)
                vllm.decode("qwen", "1", [2, 1, 0, 3] * 40)
                time.sleep(0.2)
            pages = [("serving", "/serving"), ("serving-endpoint", "/serving/1"),
                     ("serving-failing", "/serving/2"), ("serving-run", f"/runs/{run}"),
                     ("serving-runs", "/runs")]  # fmt: skip
            return photograph(server.url, pages, out, _ready, _served_part)
    finally:
        engine.dispose()
        server.stop()
        shutil.rmtree(home.parent, ignore_errors=True)


if __name__ == "__main__":
    main(__doc__ or "", take)
