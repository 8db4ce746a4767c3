"""Atomic file writes and checksums (a file is visible only when complete), a file's writes on a thread
of their own, and reading PyTorch files without running what they hold."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from queue import SimpleQueue
from typing import IO, Any

from draftdeck.errors import InputError


@contextmanager
def atomic_output(path: Path, mode: str = "wb") -> Iterator[IO]:
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
    fsync_path(path.parent)


def fsync_path(path: Path) -> None:
    """Flush a file or folder written earlier (without an fsync of its own) to disk: this one, not
    every file of the machine as os.sync() would."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class InOrder:
    """Calls run one by one on a thread of their own, in the order given, at most `depth` waiting: a
    file's hashing and writes (both release the GIL, so they overlap with the work that makes the
    bytes, on another core). The first error is raised by the next :meth:`submit` or by
    :meth:`close`; the calls after it are skipped. (threading alone: concurrent.futures would import
    logging and more, ~3 ms of every convert's start.)"""

    def __init__(self, name: str, depth: int = 2):
        self._calls: SimpleQueue[tuple[Callable[[Any], None], Any] | None] = SimpleQueue()
        self._slots = threading.Semaphore(depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run fn(arg) after the calls before it; waits while `depth` calls are pending."""
        self._raise()
        self._slots.acquire()
        self._calls.put((fn, arg))

    def close(self) -> None:
        """Wait for every call given, stop the thread, and raise the first error (if any)."""
        if self._thread.is_alive():
            self._calls.put(None)
            self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                if self._error is None:
                    call[0](call[1])
            except BaseException as exc:  # handed to the caller's thread (submit or close raises it)
                self._error = exc
            finally:
                self._slots.release()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def load_torch(path: Path, remedy: str, allow: Sequence[Any] = ()) -> Any:
    """`torch.load` of a file that runs nothing it holds: tensors, numbers, strings and containers
    (plus the types in `allow`). A PyTorch file is a pickle, and a pickle may name any function to call
    when read; a run folder or a downloaded file may have been made to. A file that names anything else
    is refused with its name, what it named and `remedy` (what the user can do instead)."""
    import pickle  # (here: torch imports both anyway, and a convert needs neither)
    import zipfile

    import torch

    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        try:
            named = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path)[:5])
        except (OSError, RuntimeError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile):
            named = ""
        what = f" ({named})" if named else ""
        raise InputError(
            f"{path}: refused: it asks to run code when read{what}, and DraftDeck reads only tensors and"
            f" plain data from a file; {remedy}"
        ) from None
    except (OSError, RuntimeError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: cannot read it as a PyTorch file ({exc}); {remedy}") from None
