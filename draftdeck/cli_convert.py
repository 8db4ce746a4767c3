"""`draftdeck convert` (registered into draftdeck.cli)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the conversion commands to `app`."""
