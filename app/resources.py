"""Where the service's non-Python files are: templates, static files, migrations.

In a wheel they are package data inside ``app`` (``setup.py`` maps the top-level ``templates/``,
``static/`` and ``migrations/`` folders there); in a source tree (a checkout, an editable install) they
are those top-level folders beside the package, as DESIGN.md lays them out. Either way they are found
from the package's own location, never from the current directory.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

NAMES = ("templates", "static", "migrations")


def resource_dir(name: str) -> Path:
    if name not in NAMES:
        raise ValueError(f"unknown resource folder {name!r}; known: {', '.join(NAMES)}")
    package = Path(str(files("app")))
    for candidate in (package / name, package.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"{name}/ is neither package data in {package} nor beside it: a broken install (rebuild the wheel)"
    )
