"""The resumable record of a regenerate job: one JSON line per finished input conversation.

``OUT.journal`` sits beside the output. Its first line names the inputs and sampling it belongs to
(a rerun with other ones is refused rather than mixed in). Each later line is one conversation's
outcome keyed by its position in the input stream: ``{"k", "row"}`` (the output row) or
``{"k", "code", "reason", "file", "line"}`` (rejected), with ``"warn"`` when checks warned. Lines
are appended in completion order and flushed one by one, so a killed job loses at most the rows in
flight; a torn last line is cut off on reopening. The output file is written from the journal in
input order at the end, then the journal is removed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from draftdeck.errors import UsageError


def journal_path(out: Path) -> Path:
    return out.with_name(out.name + ".journal")


class Journal:
    def __init__(self, path: Path, header: dict[str, Any]):
        self.path = path
        self.offsets: dict[int, int] = {}
        self.resumed = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            self._load(header)
        else:
            path.write_bytes(orjson.dumps({"journal": 1, **header}) + b"\n")
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)

    def _load(self, header: dict[str, Any]) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        try:
            head = orjson.loads(lines[0])
        except orjson.JSONDecodeError:
            head = None
        if head != {"journal": 1, **orjson.loads(orjson.dumps(header))}:
            raise UsageError(
                f"{self.path} was written for other inputs or sampling parameters; use the same ones"
                " to resume, or delete it to start over"
            )
        pos = good = len(lines[0]) + 1
        for line in lines[1:-1]:  # the last piece is empty, or the torn line of a killed job
            try:
                key = orjson.loads(line)["k"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                break
            self.offsets[int(key)] = pos
            pos = good = pos + len(line) + 1
        if good < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)
        self.resumed = len(self.offsets)

    def done(self, key: int) -> bool:
        return key in self.offsets

    def append(self, record: dict[str, Any]) -> None:
        line = orjson.dumps(record) + b"\n"
        self.offsets[int(record["k"])] = os.lseek(self._fd, 0, os.SEEK_END)
        os.write(self._fd, line)

    def records(self) -> list[dict[str, Any]]:
        """Every outcome in input order."""
        out = []
        with open(self.path, "rb") as f:
            for key in sorted(self.offsets):
                f.seek(self.offsets[key])
                out.append(orjson.loads(f.readline()))
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
