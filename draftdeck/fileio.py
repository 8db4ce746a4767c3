"""Atomic file writes and checksums: a file is visible only when complete."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_output(path: Path, mode: str = "wb") -> Iterator[IO]:  # type: ignore[type-arg]
    """Write to a temporary name beside `path`, fsync, then rename over `path`.

    If the block raises (or the process dies), `path` is untouched and the temporary file is removed
    (or, after a crash, left with a `.tmp-` name that readers never list).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    f = open(tmp, mode)  # noqa: SIM115 - closed below on every path
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)
    except BaseException:
        f.close()
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
