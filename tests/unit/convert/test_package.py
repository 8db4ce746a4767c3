"""The shape of draftdeck.convert: no private name imported across its modules, no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

import draftdeck.convert

PACKAGE = Path(draftdeck.convert.__file__).parent


def _imports() -> dict[str, list[tuple[str, list[str]]]]:
    """module -> [(imported draftdeck.convert module, names)] for each module of the package."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        found[path.stem] = [
            (node.module.removeprefix("draftdeck.convert."), [a.name for a in node.names])
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("draftdeck.convert.")
        ]
    return found


def test_no_private_name_crosses_a_module() -> None:
    imports = _imports()
    assert len(imports) >= 8, imports  # the package is really split
    crossing = [
        f"{mod} imports {name} from {src}"
        for mod, items in imports.items()
        for src, names in items
        for name in names
        if name.startswith("_")
    ]
    assert crossing == []


def test_no_import_circle() -> None:
    graph = {mod: {src for src, _ in items} for mod, items in _imports().items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    circles = [mod for mod in graph if mod != "__init__" and reaches(mod, mod, {mod})]
    assert circles == []
    assert not (PACKAGE.parent / "convert.py").exists()
    assert not (PACKAGE.parent / "scan.py").exists()
