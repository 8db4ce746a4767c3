"""Every issue code of draftdeck/issue_codes.py has advice in docs/issue_codes_advice.yml, and no advice names
a code that does not exist: the checks the docs build's hook (docs/hooks/issue_codes.py) makes, here
without MkDocs, so that a new code without documentation fails the tests too."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import yaml

from draftdeck.issue_codes import CODES

REPO_ROOT = Path(__file__).resolve().parents[2]
ADVICE = REPO_ROOT / "docs" / "issue_codes_advice.yml"
HOOK = REPO_ROOT / "docs" / "hooks" / "issue_codes.py"
PAGE = REPO_ROOT / "docs" / "troubleshooting.md"


def _advice() -> dict[str, dict[str, str]]:
    data = yaml.safe_load(ADVICE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), ADVICE
    return data


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_issue_codes_hook", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_code_has_advice() -> None:
    assert sorted(set(CODES) - set(_advice())) == []


def test_no_advice_for_a_code_that_does_not_exist() -> None:
    assert sorted(set(_advice()) - set(CODES)) == []


def test_every_advice_says_where_and_what_to_do() -> None:
    bad = [code for code, entry in _advice().items()
           if not isinstance(entry, dict) or set(entry) != {"where", "do"}
           or not all(isinstance(v, str) and v.strip() for v in entry.values())]  # fmt: skip
    assert bad == []


def test_the_hook_agrees_and_writes_an_anchor_per_code() -> None:
    """The hook finds no problem in the files as they are, and the section it writes has one heading
    per code whose anchor is the code: the dashboard links `troubleshooting.md#<code>`."""
    hook = _hook()
    advice = hook.load_advice()
    assert hook.problems(advice) == []
    assert hook.problems({k: v for k, v in advice.items() if k != "json_error"}) != []
    assert hook.problems({**advice, "no_such_code": {"where": "x", "do": "y"}}) != []
    text = hook.render(advice)
    for code in CODES:
        assert f"### {code} {{#{code}}}" in text, code
    assert PAGE.read_text(encoding="utf-8").count(hook.MARKER) == 1
