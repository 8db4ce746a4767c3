"""draftdeck.run_provenance: the commit of a real git checkout and its dirty flag, no commit (and no
failure) where there is no checkout or no git, the CLI's command line, and the versions that differ."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from draftdeck.run_provenance import checkout_state, cli_command, run_provenance, version_differences


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()  # fmt: skip


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_checkout_records_its_commit_and_whether_tracked_files_changed(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "untracked.txt").write_text("not part of the code\n")
    assert checkout_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.py").write_text("x = 2\n")
    assert checkout_state(tmp_path) == {"commit": head, "dirty": True}


def test_no_checkout_or_no_git_records_no_commit_and_does_not_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert checkout_state(tmp_path) is None  # an installed package: no .git beside it
    (tmp_path / ".git").mkdir()  # a broken repository: git fails, the run goes on
    assert checkout_state(tmp_path) is None
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))  # no git program at all
    assert checkout_state(tmp_path) is None
    prov = run_provenance({"seed": 1}, "cpu", 2)
    assert prov["torch"] == torch.__version__ and prov["world_size"] == 2 and prov["gpu"] is None
    assert prov["draftdeck_commit"] is None and prov["draftdeck_dirty"] is None


def test_the_cli_command_line_is_recorded_inside_its_run_only() -> None:
    argv = ["draftdeck", "train", "ds", "--target", "t <b>", "--out", "run"]
    with cli_command(argv):
        assert run_provenance({}, "cpu", 1)["command"] == argv
    assert run_provenance({}, "cpu", 1)["command"] is None  # a job's run: its parameters only


def test_version_differences_name_each_version_that_differs() -> None:
    a = {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.24.0", "draftdeck_commit": "a" * 40}
    b = {**a, "torch": "2.12.1", "draftdeck_commit": "b" * 40}
    assert version_differences([a, b, None, {}]) == [
        "torch 2.13.0 vs 2.12.1",
        f"draftdeck commit {'a' * 12} vs {'b' * 12}",
    ]
    assert version_differences([a, dict(a)]) == []
