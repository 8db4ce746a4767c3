"""Confining user-given paths to the configured data roots."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from draftdeck.errors import PathNotAllowedError

# POSIX filesystems (ext4, xfs, btrfs) refuse longer names; checking first turns the OSError that
# Path.exists() raises for them into a clear refusal.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095  # Linux's PATH_MAX, less the terminating NUL


def check_path_text(path: str | os.PathLike[str]) -> None:
    """Refuse a path no filesystem call can take: a NUL byte, text that is not valid Unicode (a lone
    surrogate; names from this machine's own argv decode with surrogateescape and pass), or a name
    over 255 bytes, or a path over 4095. Raises :class:`PathNotAllowedError` saying which."""
    text = os.fspath(path)
    # Shown with the offending characters escaped, so the message itself is printable text.
    shown = text[:80].encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")
    shown += "..." if len(text) > 80 else ""
    if "\x00" in text:
        raise PathNotAllowedError(f"{shown}: a path cannot contain a NUL byte")
    try:
        encoded = os.fsencode(text)
    except UnicodeEncodeError:
        raise PathNotAllowedError(f"{shown}: not valid text (a lone surrogate)") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise PathNotAllowedError(f"{shown}: {len(encoded)} bytes long; the limit is {MAX_PATH_BYTES}")
    for part in encoded.split(b"/"):
        if len(part) > MAX_NAME_BYTES:
            raise PathNotAllowedError(
                f"{shown}: a name in it is {len(part)} bytes long; the limit is {MAX_NAME_BYTES}"
            )


def resolve_in_roots(path: str | os.PathLike[str], roots: Iterable[Path], *, must_exist: bool = True) -> Path:
    """Return `path` fully resolved (symlinks included) if it lies inside one of `roots`.

    A relative path is looked up in the current directory, then in each root in turn; the first
    place where it exists wins (a new path, with `must_exist=False`, goes under the first root).
    So `data/train.jsonl` typed in the folder DraftDeck runs from, and `train.jsonl` inside the
    `data` root, name the same file. Raises :class:`PathNotAllowedError` naming the path and the
    roots when it resolves outside them, or when `must_exist` and it is missing, or when no
    filesystem could hold it (:func:`check_path_text`).
    """
    check_path_text(path)
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
