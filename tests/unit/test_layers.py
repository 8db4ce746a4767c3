"""The arrows run one way: workers/ -> app/ -> draftdeck/. Checked on what each layer really imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT


def _loaded_after(imports: str) -> set[str]:
    code = f"import sys\n{imports}\nprint('\\n'.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_the_core_and_its_cli_import_nothing_of_the_web_the_queue_or_sql() -> None:
    loaded = _loaded_after("import draftdeck.cli, draftdeck.cli.data, draftdeck.cli.tokens, draftdeck.kinds")
    assert not loaded & {"app", "workers", "fastapi", "celery", "kombu", "sqlmodel", "sqlalchemy", "uvicorn"}


def test_the_web_app_never_imports_workers() -> None:
    loaded = _loaded_after("import app.web.main, app.cli.main, app.run.job, app.run.chunks, app.run.submit")
    assert "workers" not in loaded


def test_writing_shards_does_not_import_datasets(tmp_path: Path) -> None:
    """A short `draftdeck tokenize` would spend ~0.5 s importing datasets for its schema alone."""
    code = (
        "import numpy as np\n"
        "from pathlib import Path\n"
        "from draftdeck.shards.store import ShardRow, ShardWriter, write_metadata\n"
        f"out = Path({str(tmp_path / 'ds')!r})\n"
        "w = ShardWriter(out, 10)\n"
        "w.add(ShardRow(np.arange(4, dtype=np.int32), np.array([0, 0, 1, 1], np.uint8), 'f', 1, -1, False))\n"
        "assert [s.rows for s in w.close()] == [1]\n"
    )
    loaded = _loaded_after(code)
    assert "pyarrow" in loaded  # the shard was written
    assert "datasets" not in loaded
