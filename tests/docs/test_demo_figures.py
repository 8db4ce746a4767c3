"""The demo's time and memory, quoted from one source: `app/cli/demo_figures.py` (measured by
`benchmarks/demo.py`). The README, the guide and `draftdeck demo --help` say the same sentences, and
no figure beside a demo command there comes from anywhere else (three places once quoted three sets)."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from app.cli import demo_figures as figures
from app.cli.main import make_app

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
GUIDE = REPO_ROOT / "docs" / "index.md"
NUMBER = re.compile(r"(\d[\d,]*) (s|min|MiB|GiB)\b")


def _allowed() -> set[str]:
    """Every figure the source quotes, as the pages print it."""
    sentences = [
        figures.cost(figures.QUICK),
        figures.cost(figures.FULL),
        figures.cost_on_built(figures.QUICK_EAGLE3),
    ]
    return {m.group(0) for s in sentences for m in NUMBER.finditer(s)}


def _demo_lines(path: Path) -> list[str]:
    """The lines of a page that speak of the demo's cost (a `draftdeck demo` command or the demo)."""
    return [line for line in path.read_text(encoding="utf-8").splitlines() if "demo" in line]


def test_the_readme_and_the_guide_quote_the_measured_sentences() -> None:
    readme, guide = README.read_text(encoding="utf-8"), GUIDE.read_text(encoding="utf-8")
    assert figures.cost(figures.QUICK) in " ".join(readme.split())
    assert figures.cost(figures.QUICK) in guide
    assert figures.cost(figures.FULL) in guide
    assert figures.cost_on_built(figures.QUICK_EAGLE3) in guide
    assert figures.MEASURED_ON in " ".join(guide.split())


def test_no_demo_line_quotes_a_figure_from_elsewhere() -> None:
    allowed = _allowed()
    stray = [
        (path.name, m.group(0), line)
        for path in (README, GUIDE)
        for line in _demo_lines(path)
        for m in NUMBER.finditer(line)
        if m.group(0) not in allowed
    ]
    assert not stray, f"demo figures not from app/cli/demo_figures.py: {stray}"


def test_demo_help_quotes_the_quick_demos_cost() -> None:
    command = typer.main.get_command(make_app())
    demo = command.commands["demo"]  # type: ignore[attr-defined]
    quick = next(p for p in demo.params if p.name == "quick")
    assert quick.help == figures.help_line()
    assert all(n.group(0) in _allowed() for n in NUMBER.finditer(quick.help))
