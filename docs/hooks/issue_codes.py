"""MkDocs hook: the issue codes of docs/troubleshooting.md, written from the code at build time.

Every issue code lives in ``draftdeck/quality.py`` (``CODES``: name, action, description). What to do
about each one is in ``docs/issue_codes_advice.yml``. This hook replaces the line ``<!-- issue-codes -->``
of troubleshooting.md with one section per code, each under a heading whose anchor is the code
(``troubleshooting.md#json_error``), and fails the build when a code has no advice or the advice names a
code that no longer exists. ``tests/docs/test_issue_codes.py`` checks the same without MkDocs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ADVICE_FILE = ROOT / "docs" / "issue_codes_advice.yml"
PAGE = "troubleshooting.md"
MARKER = "<!-- issue-codes -->"
KEYS = ("where", "do")

if str(ROOT) not in sys.path:  # `mkdocs build` from the checkout, with or without an installed draftdeck
    sys.path.insert(0, str(ROOT))

from draftdeck.issue_codes import CODES, Action  # noqa: E402

ACTIONS = {
    Action.REJECT: "**reject**: the row is left out and counted under `rejected`",
    Action.WARN: "**warn**: the row is kept and counted under `warnings` (`--strict` makes it an error)",
    Action.FAIL: "**fail**: the job fails as soon as it is seen",
}


class AdviceError(Exception):
    """The advice file and ``draftdeck.quality.CODES`` disagree."""


def load_advice(path: Path = ADVICE_FILE) -> dict[str, dict[str, str]]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise AdviceError(f"{path}: expected a mapping of issue code -> {{where, do}}")
    return data


def problems(advice: dict[str, Any]) -> list[str]:
    """Everything wrong between the advice and the codes (empty: they agree)."""
    out = [f"issue code {c!r} (draftdeck/quality.py) has no advice in {ADVICE_FILE.name}"
           for c in CODES if c not in advice]  # fmt: skip
    out += [f"{ADVICE_FILE.name} gives advice for {c!r}, which is not an issue code in draftdeck/quality.py"
            for c in advice if c not in CODES]  # fmt: skip
    for c, entry in advice.items():
        if c not in CODES:
            continue
        if not isinstance(entry, dict) or set(entry) != set(KEYS):
            out.append(f"{ADVICE_FILE.name}: {c!r} must have exactly the keys {', '.join(KEYS)}")
        elif not all(isinstance(entry[k], str) and entry[k].strip() for k in KEYS):
            out.append(f"{ADVICE_FILE.name}: {c!r} has an empty {' or '.join(KEYS)}")
    return out


def render(advice: dict[str, dict[str, str]]) -> str:
    """The Markdown that replaces the marker: a summary table, then one section per code."""
    lines = ["| code | action | what it means |", "|---|---|---|"]
    for name, c in CODES.items():
        lines.append(f"| [`{name}`](#{name}) | {c.action.value} | {c.description} |")
    lines.append("")
    for name, c in CODES.items():
        entry = advice[name]
        lines += [
            f"### {name} {{#{name}}}",
            "",
            f"- **What it does**: {ACTIONS[c.action]}.",
            f"- **What it means**: {c.description}.",
            f"- **Raised by**: {entry['where'].strip()}",
        ]
        if not c.loss:
            lines.append(
                "- Not counted as data lost: `--max-rejected` and the `high_rejected` alert leave it out."
            )
        lines += ["", f"**What to do**: {' '.join(entry['do'].split())}", ""]
    return "\n".join(lines)


def on_config(config: Any, **kwargs: Any) -> Any:
    """Fail the build before any page is read when the advice and the codes disagree."""
    from mkdocs.exceptions import PluginError

    found = problems(load_advice())
    if found:
        raise PluginError("issue codes and their advice disagree:\n  " + "\n  ".join(found))
    return config


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    from mkdocs.exceptions import PluginError

    if markdown.count(MARKER) != 1:
        raise PluginError(f"{PAGE} must hold the line {MARKER} exactly once")
    return markdown.replace(MARKER, render(load_advice()))
