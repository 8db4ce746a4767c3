"""Confining user-given paths to the configured data roots."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from draftdeck.errors import PathNotAllowedError


def resolve_in_roots(path: str | os.PathLike[str], roots: Iterable[Path], *, must_exist: bool = True) -> Path:
    """Return `path` fully resolved (symlinks included) if it lies inside one of `roots`.

    A relative path is looked up in the current directory, then in each root in turn; the first
    place where it exists wins (a new path, with `must_exist=False`, goes under the first root).
    So `data/train.jsonl` typed in the folder DraftDeck runs from, and `train.jsonl` inside the
    `data` root, name the same file. Raises :class:`PathNotAllowedError` naming the path and the
    roots when it resolves outside them, or when `must_exist` and it is missing.
    """
    roots = [Path(r).resolve() for r in roots]
    if not roots:
        raise PathNotAllowedError("no data roots are configured (set DRAFTDECK_DATA_ROOTS)")
    raw = Path(path).expanduser()
    bases = [Path.cwd(), *roots] if not raw.is_absolute() else [Path("/")]
    candidates = [(base / raw).resolve() for base in bases]
    inside = [c for c in candidates if any(c == root or c.is_relative_to(root) for root in roots)]
    if not inside:
        shown = ", ".join(str(r) for r in roots)
        raise PathNotAllowedError(
            f"{path}: outside the data roots ({shown}); set DRAFTDECK_DATA_ROOTS to allow it"
        )
    existing = [c for c in inside if c.exists()]
    if existing:
        return existing[0]
    if must_exist:
        raise PathNotAllowedError(f"{path}: no such file or directory in the data roots")
    # A new path (an output): under the first root when that is allowed, else wherever it was allowed.
    first_root = (roots[0] / raw).resolve()
    return first_root if first_root in inside else inside[0]
