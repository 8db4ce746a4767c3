"""CSV and TSV files: a header row names the columns, every value is text (an answer "42" stays text).

The file is cut into whole rows first (:func:`draftdeck.formats.split.csv_chunks`, which follows the
quoting), then Arrow parses a chunk of rows at a time. So a cell of any size reads (no parser block must
hold it), a row over the row limit is rejected by itself and skipped without being held, and a row
Arrow cannot parse (a wrong number of fields, bytes that are not UTF-8) is rejected by itself: the rows
after it are read and counted.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from draftdeck.errors import InputError
from draftdeck.formats.readers import RawRow
from draftdeck.formats.split import Piece, csv_chunks, row_ends


class DelimitedFile:
    """One CSV or TSV file (gzip or zstd by its suffix), read a chunk of whole rows at a time."""

    def __init__(self, path: Path, kind: str, limit: int):
        self.path = path
        self.limit = limit
        self.delimiter = "," if kind == "csv" else "\t"
        self.stream = pa.input_stream(str(path))
        self.pieces = csv_chunks(self.stream, limit)
        first = next(self.pieces, None)
        try:
            text = first.data.decode("utf-8-sig") if first is not None else ""
            header = next(csv.reader(io.StringIO(text), delimiter=self.delimiter), [])
        except (UnicodeDecodeError, csv.Error) as exc:
            raise InputError(f"{path}: cannot read its header row ({exc})") from None
        if first is not None and first.size > limit:
            raise InputError(f"{path}: its header row is over the row limit of {limit:,} bytes")
        if not header:
            raise InputError(f"{path}: cannot read as {kind} (no header row)")
        if len(set(header)) != len(header) or not all(header):
            raise InputError(f"{path}: the header row {header!r} must name every column once")
        self.header = header
        self.bytes_read = len(first.data) if first is not None else 0
        self._parse = pcsv.ParseOptions(delimiter=self.delimiter, newlines_in_values=True)
        self._convert = pcsv.ConvertOptions(
            column_types=dict.fromkeys(header, pa.string()), strings_can_be_null=False
        )

    def close(self) -> None:
        self.stream.close()

    def rows(self, name: str) -> Iterator[RawRow]:
        """Every row as a RawRow: a mapping of the header's names to text, or a rejection."""
        index = 0
        for piece in self.pieces:
            self.bytes_read += piece.size
            if piece.reason is not None or not piece.data:
                code = "oversize_row" if piece.reason is None else "json_error"
                reason = (
                    piece.reason or f"row of {piece.size:,} bytes exceeds the limit of {self.limit:,} bytes"
                )
                yield RawRow(name, index, None, None, piece.size, code, reason)
                index += 1
                continue
            for value in self._values(piece):
                if isinstance(value, tuple):
                    yield RawRow(name, index, None, None, value[1], *value[0])
                else:
                    yield RawRow(name, index, None, value, 0)
                index += 1

    def _values(self, piece: Piece) -> Iterator[dict[str, Any] | tuple[tuple[str, str], int]]:
        try:
            yield from self._table(piece.data).to_pylist()
            return
        except pa.ArrowInvalid:
            pass
        # Arrow refused the chunk: row by row, so that only the rows it cannot read are rejected
        a = np.frombuffer(piece.data, np.uint8)
        ends, _ = row_ends(a, False)
        cuts = [0, *(ends + 1).tolist()]
        if cuts[-1] < len(piece.data):
            cuts.append(len(piece.data))
        for lo, hi in itertools.pairwise(cuts):
            row = piece.data[lo:hi]
            if not row.strip():
                continue  # a blank line: Arrow skips them too
            try:
                yield from self._table(row).to_pylist()
            except pa.ArrowInvalid as exc:
                code = "encoding_error" if "utf8" in str(exc).lower() else "json_error"
                yield (code, f"unreadable {self._kind} row: {_first_line(exc)}"), len(row)

    @property
    def _kind(self) -> str:
        return "csv" if self.delimiter == "," else "tsv"

    def _table(self, data: bytes) -> pa.Table:
        read = pcsv.ReadOptions(column_names=self.header, block_size=len(data) + 1, use_threads=False)
        return pcsv.read_csv(pa.py_buffer(data), read, self._parse, self._convert)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
