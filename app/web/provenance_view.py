"""A run record's provenance (draftdeck/run_provenance.py) as the pages show it: one text per row of
the "Provenance" table, for a training run (run.json) and an eval (eval.json) alike. Older records
have none: every row reads as a dash."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from draftdeck.run_provenance import version_differences

LABELS = ("Python", "torch", "transformers", "DraftDeck", "Started by", "Parameters as given", "Device",
          "World size")  # fmt: skip
FOLDED = "Parameters as given"  # long: the page folds it under a summary


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _draftdeck(prov: Mapping[str, Any]) -> str | None:
    version, commit = prov.get("draftdeck"), prov.get("draftdeck_commit")
    if version is None and commit is None:
        return None
    said = str(version or "?")
    if isinstance(commit, str):
        said += f", commit {commit[:12]}"
        if prov.get("draftdeck_dirty"):
            said += " with uncommitted changes"
    return said


def _started_by(prov: Mapping[str, Any]) -> str | None:
    command = prov.get("command")
    if isinstance(command, list) and command:
        return shlex.join(str(a) for a in command)
    return "a job" if isinstance(prov.get("parameters"), Mapping) else None


def _device(prov: Mapping[str, Any]) -> str | None:
    device = prov.get("device")
    if device is None:
        return None
    return f"{device} ({prov['gpu']})" if prov.get("gpu") else str(device)


def provenance_rows(prov: Any) -> dict[str, str | None]:
    """Each row's text (None: not recorded), in `LABELS` order; the template escapes them."""
    p: Mapping[str, Any] = prov if isinstance(prov, Mapping) else {}
    params = p.get("parameters")
    return {
        "Python": _text(p.get("python")),
        "torch": _text(p.get("torch")),
        "transformers": _text(p.get("transformers")),
        "DraftDeck": _draftdeck(p),
        "Started by": _started_by(p),
        FOLDED: json.dumps(params, sort_keys=True) if isinstance(params, Mapping) else None,
        "Device": _device(p),
        "World size": _text(p.get("world_size")),
    }


def versions_differ(records: list[Any]) -> list[str]:
    """What differs between runs' versions (``torch 2.13.0 vs 2.12.1``), for the compare view's note."""
    return version_differences([r if isinstance(r, Mapping) else None for r in records])
