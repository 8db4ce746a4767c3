"""The web process imports neither torch nor transformers (issue 49): a dashboard installed without the
`train` extra (one that only watches runs reporting with --report-to) must start, and every start would
otherwise pay seconds and hundreds of MB for them. Checked in a fresh interpreter on what it really
loads: the CLI that starts the server, the app factory, every page module, and the main pages served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

HEAVY = ("torch", "transformers")
PAGES = ("/", "/jobs", "/runs", "/evals", "/datasets", "/alerts", "/serving")


def test_the_web_app_and_its_pages_load_neither_torch_nor_transformers(tmp_path: Path) -> None:
    modules = sorted(
        ".".join(p.relative_to(REPO_ROOT).with_suffix("").parts)
        for p in (REPO_ROOT / "app" / "web").glob("*.py")
    )
    assert "app.web.evals" in modules and "app.web.runs" in modules
    code = "\n".join(
        [
            "import importlib, json, sys",
            "import app.cli.main",  # `draftdeck up` and `draftdeck web` start from here
            *(f"importlib.import_module({m!r})" for m in modules),
            "from fastapi.testclient import TestClient",
            "from app.store.db import upgrade",
            "from app.web.main import create_app",
            "upgrade()",
            "client = TestClient(create_app())",
            f"status = {{p: client.get(p).status_code for p in {PAGES!r}}}",
            f"print(json.dumps({{'status': status, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))",
        ]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTDECK_") and k != "DATABASE_URL"}
    env.update(DRAFTDECK_HOME=str(tmp_path / "home"), DRAFTDECK_ALLOWED_HOSTS="testserver")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["status"] == dict.fromkeys(PAGES, 200), said
    assert said["heavy"] == [], f"the web process imported {said['heavy']}"
