"""Evaluation suites: the prompt sets papers and peers report tau on, shipped with DraftDeck.

A suite is a list of prompts, each with a category and one or more user turns (a multi-turn prompt is
answered turn by turn, each turn after the target's own earlier answers). Shipped suites
(``sources.json`` beside this file says where each comes from: repository, commit, path, licence, how
a prompt was made, sha256; ``scripts/build_suites.py`` rebuilds them): ``spec-bench``, ``mt-bench``,
``gsm8k``, ``humaneval``. A user's own JSONL file is a suite too: rows with a ``category`` and
``turns`` (a list of texts), a ``prompt`` (one text) or OpenAI ``messages`` (their user turns).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from draftdeck.errors import InputError, UsageError
from draftdeck.quality import Report

HERE = Path(__file__).resolve().parent
NO_CATEGORY = "(none)"  # the category of a user's row that names none


@dataclass(frozen=True)
class SuitePrompt:
    suite: str
    id: str
    category: str
    turns: tuple[str, ...]
    file: str  # where it was read (the suite's file), and its line there
    line: int


@cache
def sources() -> dict[str, dict[str, Any]]:
    """The shipped suites' records (sources.json), by name."""
    data: dict[str, dict[str, Any]] = json.loads((HERE / "sources.json").read_text(encoding="utf-8"))
    return data


def names() -> list[str]:
    return list(sources())


def _lines(name: str) -> tuple[Path, list[str]]:
    """A shipped suite's file and its lines, checked against its recorded sha256."""
    meta = sources()[name]
    path = HERE / meta["file"]
    blob = path.read_bytes()
    if hashlib.sha256(blob).hexdigest() != meta["sha256"]:
        raise InputError(f"{path}: its sha256 differs from sources.json's: the suite file was changed")
    return path, gzip.decompress(blob).decode("utf-8").splitlines()


def _turns(row: dict[str, Any]) -> list[str] | None:
    """The user turns of a row: `turns`, `prompt`, or the user messages of `messages` (None: none)."""
    turns = row.get("turns")
    if turns is None and isinstance(row.get("prompt"), str):
        turns = [row["prompt"]]
    if turns is None and isinstance(row.get("messages"), list):
        turns = [m.get("content") for m in row["messages"] if isinstance(m, dict) and m.get("role") == "user"]
    if isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns):
        return turns
    return None


def load(spec: str, report: Report, max_per_category: int | None = None) -> list[SuitePrompt]:
    """The prompts of suite `spec` (a shipped suite's name, or a JSONL file), at most
    `max_per_category` of each category (the first ones, in file order). Every row read is counted
    in `report`; a row with no usable turn is rejected with its reason."""
    if spec in sources():
        path, lines = _lines(spec)
        name = spec
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise UsageError(f"suite {spec!r}: neither a shipped suite ({', '.join(names())}) nor a file")
        lines = path.read_text(encoding="utf-8").splitlines()
        name = path.stem
    taken: dict[str, int] = {}
    out: list[SuitePrompt] = []
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            report.rows_in += 1
            report.reject("json_error", str(path), line_no, str(exc))
            continue
        category = str(row.get("category") or NO_CATEGORY) if isinstance(row, dict) else NO_CATEGORY
        if max_per_category is not None and taken.get(category, 0) >= max_per_category:
            continue  # past the sample: not read, not counted
        report.rows_in += 1
        turns = _turns(row) if isinstance(row, dict) else None
        if turns is None:
            why = (
                "no `turns`, `prompt` or user `messages` with text" if isinstance(row, dict) else "no object"
            )
            report.reject("unknown_format", str(path), line_no, why)
            continue
        taken[category] = taken.get(category, 0) + 1
        ident = str(row.get("id", row.get("question_id", line_no)))
        out.append(SuitePrompt(name, ident, category, tuple(turns), str(path), line_no))
    return out
