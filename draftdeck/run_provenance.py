"""What a run ran with: the versions that decide its numbers, how it was started, and where.

One record (:func:`run_provenance`) goes into a training run's run.json and an eval's eval.json under
``provenance``: Python, torch, transformers and DraftDeck's versions, DraftDeck's git commit and
whether the checkout had uncommitted changes (only when DraftDeck runs from a checkout), the command
line (a run started by the ``draftdeck`` CLI) or the job's parameters as given, the device (and GPU
name) and the world size. Two runs that differ in torch can differ in their figures for no reason of
their own: the compare view names such differences (:func:`version_differences`).

Git is asked only where the package's folder sits in a checkout; a missing git, a broken repository
or a slow one records no commit and never fails the run.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

# Set by the CLI's train and eval commands for the run they start (inherited by the ranks it spawns);
# a job run by a worker has no command line of its own, only its parameters.
COMMAND_ENV = "DRAFTDECK_RUN_COMMAND"
VERSIONED = ("python", "torch", "transformers", "draftdeck", "draftdeck_commit")
GIT_SECONDS = 5.0  # a repository on a stalled network file system must not hold up a run


@contextmanager
def cli_command(argv: Sequence[str] | None = None) -> Iterator[None]:
    """Within it, runs record `argv` (default: this process's sys.argv) as the command that started them."""
    before = os.environ.get(COMMAND_ENV)
    os.environ[COMMAND_ENV] = json.dumps(list(sys.argv if argv is None else argv))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(COMMAND_ENV, None)
        else:
            os.environ[COMMAND_ENV] = before


def _command() -> list[str] | None:
    raw = os.environ.get(COMMAND_ENV)
    if not raw:
        return None
    try:
        argv = json.loads(raw)
    except ValueError:
        return None
    return [str(a) for a in argv] if isinstance(argv, list) else None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git(root: Path, *args: str) -> str | None:
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run(
            [git, "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_SECONDS, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def checkout_state(root: Path | None = None) -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` of the checkout DraftDeck runs from (`root`: the folder above
    the package), or None when it is installed rather than checked out, or git cannot say."""
    if root is None:
        root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():  # an installed package: no git call at all
        return None
    commit = _git(root, "rev-parse", "HEAD")
    if not commit or not commit.strip():
        return None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def device_description(device: Any) -> dict[str, Any]:
    """``{"device": "cpu"|"cuda"|..., "gpu": name or None}`` of a torch device (or its name)."""
    import torch

    dev = torch.device(device)
    gpu = None
    if dev.type == "cuda" and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(dev)
    return {"device": dev.type, "gpu": gpu}


def run_provenance(parameters: Mapping[str, Any], device: Any, world_size: int) -> dict[str, Any]:
    """The record run.json and eval.json keep under ``provenance``. `parameters`: the run's
    parameters as given (a job's, or those the CLI's options made); `device`: where rank 0 ran."""
    import torch
    import transformers

    import draftdeck

    git = checkout_state()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "draftdeck": _version("draftdeck") or draftdeck.__version__,
        "draftdeck_commit": None if git is None else git["commit"],
        "draftdeck_dirty": None if git is None else git["dirty"],
        "command": _command(),
        "parameters": json.loads(json.dumps(dict(parameters), default=str)),
        **device_description(device),
        "world_size": int(world_size),
    }


def version_differences(records: Sequence[Mapping[str, Any] | None]) -> list[str]:
    """What differs between runs' provenance records, one phrase per version in the order given, e.g.
    ``torch 2.13.0 vs 2.12.1``; records that name no version (older runs) are left out of it."""
    shown = [r for r in records if isinstance(r, Mapping)]
    out = []
    for key in VERSIONED:
        values = list(dict.fromkeys(str(r[key]) for r in shown if r.get(key) is not None))
        if len(values) > 1:
            name = "draftdeck commit" if key == "draftdeck_commit" else key
            short = [v[:12] if key == "draftdeck_commit" else v for v in values]
            out.append(f"{name} {' vs '.join(short)}")
    return out
