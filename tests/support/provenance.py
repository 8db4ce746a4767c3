"""Checks of a run record's `provenance` (draftdeck/run_provenance.py) shared by the train and eval tests."""

from __future__ import annotations

import platform
import subprocess
from typing import Any

import torch
import transformers

from tests.conftest import REPO_ROOT


def assert_provenance(prov: dict[str, Any], *, device: str = "cpu", world_size: int = 1) -> None:
    """`prov` names this process's versions, device and world size, and this checkout's commit."""
    assert prov["torch"] == torch.__version__ and prov["transformers"] == transformers.__version__
    assert prov["python"] == platform.python_version()
    assert prov["device"] == device and prov["world_size"] == world_size
    if (REPO_ROOT / ".git").exists():
        commit = prov["draftdeck_commit"]
        assert isinstance(commit, str) and len(commit) == 40 and isinstance(prov["draftdeck_dirty"], bool)
        # HEAD may have moved on since the run started (others commit meanwhile): the run's is in its past
        ancestor = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "merge-base", "--is-ancestor", commit, "HEAD"]
        )
        assert ancestor.returncode == 0, commit
    else:
        assert prov["draftdeck_commit"] is None
