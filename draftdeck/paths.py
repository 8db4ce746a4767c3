"""Confining user-given paths to the configured data roots."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from draftdeck.errors import PathNotAllowedError


def resolve_in_roots(path: str | os.PathLike[str], roots: Iterable[Path], *, must_exist: bool = True) -> Path:
    """Return `path` fully resolved (symlinks included) if it lies inside one of `roots`.

    Relative paths are taken relative to the first root. Raises :class:`PathNotAllowedError`
    naming the path and the roots otherwise, or when `must_exist` and the path is missing.
    """
    roots = [Path(r).resolve() for r in roots]
    if not roots:
        raise PathNotAllowedError("no data roots are configured (set DRAFTDECK_DATA_ROOTS)")
    raw = Path(path).expanduser()
    candidate = raw if raw.is_absolute() else roots[0] / raw
    resolved = candidate.resolve()
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        shown = ", ".join(str(r) for r in roots)
        raise PathNotAllowedError(
            f"{path}: outside the data roots ({shown}); set DRAFTDECK_DATA_ROOTS to allow it"
        )
    if must_exist and not resolved.exists():
        raise PathNotAllowedError(f"{path}: no such file or directory")
    return resolved
