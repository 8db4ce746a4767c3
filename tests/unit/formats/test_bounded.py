"""Reading costs memory linear in the input, whatever it holds (issue 48): records are framed before they
are parsed (draftdeck/formats/split.py), a too-deep or too-large record is rejected alone by code, and the
records after it are read and counted."""

from __future__ import annotations

import csv
import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdeck.convert import ConvertOptions, convert
from draftdeck.formats.readers import iter_rows
from draftdeck.formats.split import MAX_DEPTH, csv_chunks, json_records
from draftdeck.formats.tables import open_reader

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
# text that is hard to frame: quotes, backslashes and brackets inside strings
TRICKY = st.text(alphabet='"\\[]{},:é \n\tab', max_size=12)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(VALUES, max_size=6), st.sampled_from([1, 2, 3, 7, 64, 1 << 20]), st.booleans())
def test_array_items_are_framed_exactly_at_any_block_size(items: list[Any], block: int, pretty: bool) -> None:
    text = json.dumps(items, indent=1 if pretty else None, ensure_ascii=False).encode()
    pieces = list(json_records(io.BytesIO(text), 1, 1 << 30, block))
    assert [p.reason for p in pieces] == [None] * len(items)
    assert [orjson.loads(p.data) for p in pieces] == items


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(TRICKY, VALUES, max_size=3), max_size=5), st.sampled_from([1, 5, 1 << 20]))
def test_concatenated_objects_are_framed_exactly(objects: list[dict[str, Any]], block: int) -> None:
    text = "\n".join(json.dumps(o, indent=1) for o in objects).encode()
    pieces = list(json_records(io.BytesIO(text), 0, 1 << 30, block))
    assert [orjson.loads(p.data) for p in pieces] == objects


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.text(alphabet='"a,\n\r é', max_size=8), min_size=2, max_size=2), min_size=1, max_size=6
    ),
    st.sampled_from([1, 2, 7, 1 << 20]),
    st.sampled_from(["\n", "\r\n"]),
)
def test_csv_pieces_hold_whole_rows(rows: list[list[str]], block: int, newline: str) -> None:
    out = io.StringIO()
    # a lone "\r" is quoted only when it is part of the line terminator, or with every field quoted
    writer = csv.writer(
        out, lineterminator=newline, quoting=csv.QUOTE_ALL if newline == "\n" else csv.QUOTE_MINIMAL
    )
    writer.writerow(["prompt", "response"])
    writer.writerows(rows)
    pieces = list(csv_chunks(io.BytesIO(out.getvalue().encode()), 1 << 30, block))
    assert next(csv.reader(io.StringIO(pieces[0].data.decode()))) == ["prompt", "response"]
    got = [r for p in pieces[1:] for r in csv.reader(io.StringIO(p.data.decode(), newline=""))]
    assert got == rows


def test_framing_names_what_is_no_record() -> None:
    def reasons(text: bytes, level: int) -> list[str | None]:
        return [p.reason for p in json_records(io.BytesIO(text), level, 100, 4)]

    assert reasons(b"[1, 2", 1) == [None, "the array is not closed: the file ends inside it"]
    assert reasons(b"[1] x", 1) == [None, "data after the array's closing bracket"]
    assert reasons(b"[] ", 1) == []
    assert reasons(b'{"a": 1} {"b":', 0) == [None, "the file ends inside a value"]
    assert reasons(b'{"a": 1}} {"b": 2}', 0)[1] == (
        "a closing bracket with nothing open: the rest of the file is not JSON"
    )


def _peak(fn: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_200_kb_nested_file_is_rejected_by_code_in_little_memory(tmp_path: Path) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    line = json.dumps(CHAT).encode()
    cases = {
        "deep.json": deep,  # the review's file: 20 GB and an OOM kill before
        "rows.json": b"[" + line + b"," + deep + b"," + line + b"]",
        "rows.jsonl": line + b"\n" + deep + b"\n" + line + b"\n",
        "objects.json": line + b"\n" + b'{"a": ' + deep + b"}\n" + line,
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        rows, peak = _peak(lambda path=path: list(iter_rows(path)))
        assert peak < 8 * 2**20, (name, peak)  # a few times the file, never its depth squared
        errors = [r.error for r in rows]
        assert errors.count("too_deep") == 1 and errors.count(None) == len(rows) - 1, (name, errors)
        bad = next(r for r in rows if r.error)
        assert f"{MAX_DEPTH:,} levels" in (bad.reason or "")
    report = convert([tmp_path / "rows.json"], tmp_path / "out.jsonl", "openai", options=ConvertOptions())
    assert (report.rows_in, report.rows_out, report.rejected) == (3, 2, {"too_deep": 1})


def test_depth_at_the_limit_reads_and_one_past_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "edge.json"
    ok = b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1)  # an item MAX_DEPTH - 1 deep, in the array
    over = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    path.write_bytes(b"[" + ok + b"," + over + b"]")
    assert [r.error for r in iter_rows(path)] == [None, "too_deep"]


def test_an_oversize_array_item_is_skipped_without_holding_it(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    big = json.dumps({"text": "x" * 20_000_000})
    path.write_text(f"[{json.dumps(CHAT)}, {big}, {json.dumps(CHAT)}]")
    rows, peak = _peak(lambda: list(iter_rows(path, max_row_bytes=100_000)))
    assert [r.error for r in rows] == [None, "oversize_row", None]
    assert rows[1].nbytes == len(big) + 1 and "exceeds the limit of 100,000 bytes" in (rows[1].reason or "")
    assert peak < 5_000_000  # a few blocks of 1 MB: the 20 MB item was never held


def test_an_invalid_item_is_rejected_alone_and_the_rest_read(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(b'[{"a": 1}, {"b": nope}, {"c": "\xff"}, {"d": 4}]')
    rows = list(iter_rows(path))
    assert [r.error for r in rows] == [None, "json_error", "encoding_error", None]
    assert rows[3].value == {"d": 4} and rows[3].index == 3


def _csv(tmp_path: Path, name: str, rows: list[list[str]]) -> Path:
    path = tmp_path / name
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt", "response"])
        writer.writerows(rows)
    return path


def test_a_csv_cell_of_10_mb_reads_and_the_rows_after_it_too(tmp_path: Path) -> None:
    huge = 'a line, with "quotes"\n' * 480_000  # 10.5 MB, newlines inside quotes: Arrow's block was 1 MB
    path = _csv(tmp_path, "big.csv", [["q1", "a1"], ["q2", huge], ["q3", "a3"]])
    with open_reader(path) as reader:
        rows = list(reader)
    assert [r.error for r in rows] == [None, None, None]
    assert rows[1].value == {"prompt": "q2", "response": huge} and rows[2].value["prompt"] == "q3"
    with open_reader(path, max_row_bytes=1_000_000) as reader:
        rows = list(reader)
    assert [r.error for r in rows] == [None, "oversize_row", None]
    assert rows[2].value == {"prompt": "q3", "response": "a3"} and rows[2].index == 2


def test_a_csv_row_arrow_cannot_read_is_rejected_alone(tmp_path: Path) -> None:
    path = tmp_path / "ragged.csv"
    path.write_bytes(b"prompt,response\nq1,a1\nq2,a2,extra\nq3,\xff\nq4,a4\n")
    with open_reader(path) as reader:
        rows = list(reader)
    assert [r.error for r in rows] == [None, "json_error", "encoding_error", None]
    assert "Expected 2 columns, got 3" in (rows[1].reason or "")
    assert rows[3].value == {"prompt": "q4", "response": "a4"}


def test_a_parquet_row_over_the_limit_is_rejected_alone(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"prompt": ["q1", "q2", "q3"], "response": ["a1", "x" * 200_000, "a3"]}), path)
    with open_reader(path, max_row_bytes=100_000) as reader:
        rows = list(reader)
    assert [r.error for r in rows] == [None, "oversize_row", None]
    assert rows[2].value == {"prompt": "q3", "response": "a3"}
