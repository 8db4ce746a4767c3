"""What a path a user typed means (one rule for every entry point), and confining it to the data
roots."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
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


def resolve_user_path(
    path: str | os.PathLike[str], roots: Sequence[Path] | None = None, *, cwd: Path | None = None
) -> Path:
    """THE rule for a path a user typed, in every entry point (form, JSON API, `jobs submit`, CLI)
    and for inputs and outputs alike: the absolute path it names, symlinks resolved.

    An absolute path is itself. A relative one is taken from the working folder (`cwd`: the server's,
    or the shell's for an in-process command) when that lands inside a root; otherwise from the first
    root. With `roots=None` (the in-process CLI, which has no sandbox) every place is allowed, so a
    relative path is simply relative to the working folder. So `data/x.jsonl` typed in the folder
    DraftDeck runs from is `./data/x.jsonl` everywhere, and `x.jsonl` on the server is the same file
    as `data/x.jsonl` (first root `./data`). Whether the file exists never changes the answer: an
    input and an output typed alike are the same file.
    """
    check_path_text(path)
    raw = Path(path).expanduser()
    if raw.is_absolute():
        return raw.resolve()
    from_cwd = ((cwd or Path.cwd()) / raw).resolve()
    if roots is None:
        return from_cwd
    resolved_roots = [Path(r).resolve() for r in roots]
    if not resolved_roots or inside_roots(from_cwd, resolved_roots):
        return from_cwd
    return (resolved_roots[0] / raw).resolve()


def inside_roots(path: Path, roots: Sequence[Path]) -> bool:
    """Whether `path` is one of `roots` or lies under one (both already resolved: symlinks and ``..``
    gone, or a link inside a root would pass for the file outside it points at)."""
    return any(path == root or path.is_relative_to(root) for root in roots)


def resolve_in_roots(
    path: str | os.PathLike[str], roots: Iterable[Path], *, must_exist: bool = True, cwd: Path | None = None
) -> Path:
    """:func:`resolve_user_path`, confined: the path if it lies inside one of `roots`.

    Raises :class:`PathNotAllowedError` naming the path (and the absolute path it resolved to) and
    the roots when it resolves outside them, or when `must_exist` and it is missing, or when no
    filesystem could hold it (:func:`check_path_text`).
    """
    check_path_text(path)
    resolved_roots = [Path(r).resolve() for r in roots]
    if not resolved_roots:
        raise PathNotAllowedError("no data roots are configured (set DRAFTDECK_DATA_ROOTS)")
    resolved = resolve_user_path(path, resolved_roots, cwd=cwd)
    # The path as typed comes first (what the user recognises), then the absolute path it meant.
    meant = "" if str(resolved) == os.fspath(path) else f"; it means {resolved}"
    if not inside_roots(resolved, resolved_roots):
        shown = ", ".join(str(r) for r in resolved_roots)
        raise PathNotAllowedError(
            f"{path}: outside the data roots ({shown}){meant}; set DRAFTDECK_DATA_ROOTS to allow it"
        )
    if must_exist and not resolved.exists():
        raise PathNotAllowedError(f"{path}: no such file or directory{meant}")
    return resolved
