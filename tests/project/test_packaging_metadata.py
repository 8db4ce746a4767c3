"""Packaging metadata and the README: what an install prints and what a reader of the README can follow."""

from __future__ import annotations

import re
import warnings

from tests.conftest import REPO_ROOT


def test_pyproject_applies_without_setuptools_warnings() -> None:
    """`pip install` prints every setuptools deprecation warning (the license as a TOML table was one)."""
    from setuptools.config import pyprojecttoml
    from setuptools.dist import Distribution

    dist = Distribution()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pyprojecttoml.apply_configuration(dist, str(REPO_ROOT / "pyproject.toml"))
    assert [str(w.message).splitlines()[0] for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"


def test_readme_stands_on_its_own() -> None:
    """Users have the checkout or the wheel, never the design notes beside it: the README names no
    folder outside the repository, and every repository path it names exists."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "../" not in text
    assert not re.search(r"\b(DESIGN|DOMAIN|UX)\.md\b", text)
    top = "docs|benchmarks|draftdeck|app|workers|templates|static|migrations"
    named = set(re.findall(rf"`((?:{top})/[\w./-]*)", text))
    named |= {m for m in re.findall(r"\]\(([^)#]+)\)", text) if "://" not in m}
    assert named, "the README names repository paths; the pattern must find them"
    missing = sorted(p for p in named if not (REPO_ROOT / p.rstrip("/")).exists())
    assert missing == []
