"""Every command's --help reads cleanly at 80 columns: plain value names, no type noise, nothing cut."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner


def _commands(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(cmd, "commands", {}).items():  # Typer's own click: duck-typed
        yield from _commands(sub, (*path, name))


def test_every_help_at_80_columns_has_plain_value_names_and_whole_words() -> None:
    from app.cli.main import app

    paths = list(_commands(typer.main.get_command(app)))
    assert len(paths) > 15 and ("tokenize",) in paths and ("jobs", "submit") in paths
    runner = CliRunner()
    for path in paths:
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert res.exit_code == 0, (path, res.output)
        text = res.output
        where = " ".join(path) or "draftdeck"
        assert not re.search(r"<(bool|int|int range|float|float range|path|text|str|list\[\w+\])>", text), (
            where,
            text,
        )  # options and arguments alike: "INPUT", not "INPUT <list[Path]>"
        assert "…" not in text and "╭" not in text, (where, text)  # no cut option names, no boxes
        assert max(map(len, text.splitlines())) <= 80, (where, text)
        # a default or range never breaks inside a word ("[default: no-" / "strict]")
        assert not re.search(r"[\w-]-\n\s+\w", text), (where, text)
