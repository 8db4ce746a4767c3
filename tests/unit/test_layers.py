"""The arrows run one way: workers/ -> app/ -> draftdeck/. Checked on what each layer really imports."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT


def _loaded_after(imports: str) -> set[str]:
    code = f"import sys\n{imports}\nprint('\\n'.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_the_core_and_its_cli_import_nothing_of_the_web_the_queue_or_sql() -> None:
    loaded = _loaded_after(
        "import draftdeck.cli, draftdeck.cli.data, draftdeck.cli.tokens, draftdeck.jobs.registry"
    )
    assert not loaded & {"app", "workers", "fastapi", "celery", "kombu", "sqlmodel", "sqlalchemy", "uvicorn"}


def test_the_web_app_never_imports_workers() -> None:
    loaded = _loaded_after("import app.main, app.cli_service, app.runner, app.chunks, app.submit")
    assert "workers" not in loaded
