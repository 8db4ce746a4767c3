"""Columnar inputs: Parquet (streamed by record batch), Arrow IPC (file or stream format) and
HF `datasets` ``save_to_disk`` directories (``state.json`` listing Arrow stream files, or a
``dataset_dict.json`` with one such directory per split).

Rows come out as :class:`RawRow` values like the JSON readers', so the same detection applies.
Nested columns become Python dicts and lists; null struct fields become None (parsers treat None
as absent). ``line`` is None and ``index`` counts rows within each file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from draftdeck.errors import InputError
from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES, RawRow, RowReader

if TYPE_CHECKING:  # pyarrow is imported only when a columnar file is read
    import pyarrow as pa

BATCH_ROWS = 1024
_PARQUET_MAGIC = b"PAR1"
_ARROW_FILE_MAGIC = b"ARROW1"
_ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"


def hf_dataset_files(folder: Path) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` folder (a Dataset, or a DatasetDict's splits in order)."""
    state = folder / "state.json"
    if state.is_file():
        try:
            data = json.loads(state.read_text(encoding="utf-8"))
            files = [folder / f["filename"] for f in data["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{state}: not a datasets state.json ({exc})") from None
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise InputError(f"{folder}: state.json lists missing files: {', '.join(missing)}")
        return files
    ddict = folder / "dataset_dict.json"
    if ddict.is_file():
        try:
            splits = json.loads(ddict.read_text(encoding="utf-8"))["splits"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{ddict}: not a datasets dataset_dict.json ({exc})") from None
        return [f for split in splits for f in hf_dataset_files(folder / split)]
    raise InputError(
        f"{folder}: is a directory but not a datasets save_to_disk folder"
        " (no state.json or dataset_dict.json)"
    )


def container_of(head: bytes) -> str | None:
    """ "parquet", "arrow-file", "arrow-stream" or None (a JSON text file, maybe compressed), from a
    file's first bytes."""
    if head.startswith(_PARQUET_MAGIC):
        return "parquet"
    if head.startswith(_ARROW_FILE_MAGIC):
        return "arrow-file"
    if head.startswith(_ARROW_STREAM_MAGIC):
        return "arrow-stream"
    return None


# Delimited text, known by its suffix (it has no magic bytes): a header row names the columns.
DELIMITERS = {".csv": ("csv", ","), ".tsv": ("tsv", "\t")}


def delimited_kind(path: Path) -> str | None:
    """ "csv" or "tsv" for a file named so (also under a compression suffix), else None."""
    name = path.name.lower()
    for suffix in COMPRESSION:
        name = name.removesuffix(suffix)
    return next((kind for suffix, (kind, _) in DELIMITERS.items() if name.endswith(suffix)), None)


def sniff_table(path: Path) -> str | None:
    """:func:`container_of` the file at `path`, or "csv"/"tsv" by its name (None: a JSON text file,
    or it cannot be read)."""
    try:
        with open(path, "rb") as f:
            found = container_of(f.read(8))
    except OSError:
        return None
    return found or delimited_kind(path)


class TableRowReader:
    """Iterates the rows of one Parquet, Arrow, CSV or TSV file batch by batch; same interface as
    RowReader. A CSV or TSV row is a mapping from the header's column names to text (never numbers:
    an answer "42" stays text), so the shapes are detected by column name as for JSON rows
    (other names: the row is unknown_format, counted and named)."""

    def __init__(
        self,
        path: Path,
        container: str,
        *,
        display_name: str | None = None,
        max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    ):
        self.path = path
        self.max_row_bytes = max_row_bytes
        self.name = display_name or str(path)
        self.container = container
        self.compression: str | None = None
        self.size: int | None = path.stat().st_size
        self._rows_done = 0
        self._rows_total: int | None = None
        self._source: Any = None
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if container == "parquet":
                self._source = pq.ParquetFile(path)
                self._rows_total = self._source.metadata.num_rows
            elif container in ("csv", "tsv"):
                from draftdeck.formats.delimited import DelimitedFile

                self._source = DelimitedFile(path, container, max_row_bytes)
            else:
                mm = pa.memory_map(str(path), "r")
                self._source = pa.ipc.open_file(mm) if container == "arrow-file" else pa.ipc.open_stream(mm)
        except (pa.ArrowInvalid, OSError, UnicodeDecodeError, StopIteration) as exc:
            raise InputError(f"{path}: cannot read as {container} ({exc or 'no header row'})") from None

    @property
    def bytes_read(self) -> int:
        """Bytes as an estimate from rows done (columnar files are not read front to back); a CSV file's
        bytes read, while it is being read."""
        if self.size and self._rows_total is None and self.container in ("csv", "tsv"):
            return min(self.size, self._source.bytes_read)
        if not self.size or not self._rows_total:
            return 0
        return min(self.size, self.size * self._rows_done // self._rows_total)

    def _is_own(self) -> bool:
        if self.container in ("csv", "tsv"):
            return False
        schema = self._source.schema_arrow if self.container == "parquet" else self._source.schema
        return (schema.metadata or {}).get(b"draftdeck") == b"conversations/1"

    def _batches(self) -> Iterator[pa.RecordBatch]:
        if self.container == "parquet":
            yield from self._source.iter_batches(batch_size=BATCH_ROWS)
        elif self.container == "arrow-file":
            for i in range(self._source.num_record_batches):
                yield self._source.get_batch(i)
        else:
            yield from self._source

    def __iter__(self) -> Iterator[RawRow]:
        if self.container in ("csv", "tsv"):
            for row in self._source.rows(self.name):
                self._rows_done += 1
                yield row
            self._rows_total = self._rows_done  # read to its end: every byte was read
            return
        yield from self._columnar()

    def _columnar(self) -> Iterator[RawRow]:
        import pyarrow as pa

        index = 0
        own = self._is_own()
        limit = self.max_row_bytes
        try:
            for batch in self._batches():
                for start in range(0, batch.num_rows, BATCH_ROWS):
                    part = batch.slice(start, BATCH_ROWS)
                    sizes = (
                        [part.slice(i, 1).nbytes for i in range(part.num_rows)] if part.nbytes > limit else []
                    )
                    for i, value in enumerate(part.to_pylist() if not sizes else _within(part, sizes, limit)):
                        if value is None:
                            why = f"row of {sizes[i]:,} bytes exceeds the limit of {limit:,} bytes"
                            yield RawRow(self.name, index, None, None, sizes[i], "oversize_row", why)
                        else:
                            yield RawRow(self.name, index, None, _own_row(value) if own else value, 0)
                        index += 1
                        self._rows_done += 1
        except (pa.ArrowInvalid, OSError) as exc:
            yield RawRow(
                self.name, index, None, None, 0, "json_error", f"unreadable {self.container} data: {exc}"
            )

    def close(self) -> None:
        if self.container in ("parquet", "csv", "tsv") and self._source is not None:
            self._source.close()

    def __enter__(self) -> TableRowReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _within(part: pa.RecordBatch, sizes: list[int], limit: int) -> Iterator[dict[str, Any] | None]:
    """The rows of `part` as values, None for each row over `limit` bytes (never made into Python)."""
    for i, size in enumerate(sizes):
        yield None if size > limit else part.slice(i, 1).to_pylist()[0]


def _own_row(value: dict[str, Any]) -> dict[str, Any]:
    """A row of DraftDeck's own Parquet: JSON text columns back to values, kept fields back on top."""
    row: dict[str, Any] = {}
    meta = value.get("meta")
    if isinstance(meta, str):
        try:
            row.update(orjson.loads(meta))
        except orjson.JSONDecodeError:
            row["meta"] = meta
    row["messages"] = value.get("messages")
    tools = value.get("tools")
    if tools is not None:
        row["tools"] = tools  # JSON text: the readers parse it
    return row


# The data files convert reads, by suffix (with the names the file picker shows), and the compressions
# it reads them under: what a plain folder given as input is read for. Other files in it (notes,
# licences, hidden files) are not data.
DATA_SUFFIXES = {".jsonl": "JSONL", ".ndjson": "JSONL", ".json": "JSON", ".parquet": "Parquet",
                 ".arrow": "Arrow IPC", ".feather": "Arrow IPC", ".csv": "CSV", ".tsv": "TSV"}  # fmt: skip
COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
CONTAINER_NAMES = {"parquet": "Parquet", "arrow-file": "Arrow IPC", "arrow-stream": "Arrow IPC", "csv": "CSV",
                   "tsv": "TSV"}  # fmt: skip


def is_data_file(path: Path) -> bool:
    name = path.name.lower()
    for suffix in COMPRESSION:
        name = name.removesuffix(suffix)
    return not path.name.startswith(".") and name.endswith(tuple(DATA_SUFFIXES))


def skipped_in(path: Path) -> list[tuple[Path, str]]:
    """What `expand_inputs` does not read in the folder `path`, each with why (nothing for a file)."""
    if not path.is_dir() or _is_saved_dataset(path):
        return []
    out: list[tuple[Path, str]] = []
    for child in sorted(path.iterdir()):
        if child.name.startswith("."):
            out.append((child, "hidden"))
        elif child.is_dir() and not _is_saved_dataset(child):
            out.append((child, "a folder: folders are read only when given on their own"))
        elif child.is_file() and not is_data_file(child):
            out.append((child, f"not a data file (read: {', '.join(DATA_SUFFIXES)})"))
    return out


def _is_saved_dataset(folder: Path) -> bool:
    return (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()


def expand_inputs(path: Path) -> list[Path]:
    """A data file as is; a ``save_to_disk`` folder as its Arrow files; any other folder as the data
    files and ``save_to_disk`` folders directly in it, by name (not recursive: other folders in it
    are given on their own). A folder with no data in it is an InputError saying what was looked for."""
    if not path.is_dir():
        return [path]
    if _is_saved_dataset(path):
        return hf_dataset_files(path)
    files: list[Path] = []
    for child in sorted(path.iterdir()):
        if child.is_dir():
            if _is_saved_dataset(child):
                files.extend(hf_dataset_files(child))
        elif is_data_file(child):
            files.append(child)
    if not files:
        raise InputError(
            f"{path}: no data files in this folder (looked for {', '.join(DATA_SUFFIXES)}, also under"
            f" {', '.join(COMPRESSION)}, and save_to_disk folders; other folders in it are not read)"
        )
    return files


def open_reader(
    path: Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES, display_name: str | None = None
) -> RowReader | TableRowReader:
    """The right reader for one file: Parquet / Arrow by magic bytes, CSV / TSV by name, else the
    JSON readers."""
    container = sniff_table(path) if path.is_file() else None
    if container is not None:
        return TableRowReader(path, container, display_name=display_name, max_row_bytes=max_row_bytes)
    return RowReader(path, display_name=display_name, max_row_bytes=max_row_bytes)
