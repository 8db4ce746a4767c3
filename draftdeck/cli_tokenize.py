"""`draftdeck tokenize`, `inspect`, `vocab`, `export` (registered into draftdeck.cli)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the tokenization commands to `app`."""
