"""The documentation check can fail (issue 48): `make docs-check`, which `make test` runs, fails on a
broken anchor planted in a copy of the docs, and passes on the docs as they are."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO_ROOT


def _check(site: Path) -> subprocess.CompletedProcess[str]:
    command = ["make", "-s", "-C", str(REPO_ROOT), "docs-check"]
    where = [f"MKDOCS_CONFIG={site / 'mkdocs.yml'}", f"SITE_DIR={site / 'out'}"]
    return subprocess.run([*command, *where], capture_output=True, text=True, timeout=300)


def test_a_broken_anchor_fails_the_docs_check_and_the_docs_pass(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    ok = _check(tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [training](train.md#no-such-heading).\n")
    broken = _check(tmp_path)
    assert broken.returncode != 0
    assert "does not contain an anchor '#no-such-heading'" in broken.stdout + broken.stderr
