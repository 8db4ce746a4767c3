"""Reading files of every container and scanning them, including the bad inputs of issue 2."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import zstandard

from draftdeck.errors import InputError, JobFailed, PathNotAllowedError
from draftdeck.formats.readers import RowReader, iter_rows
from draftdeck.paths import resolve_in_roots
from draftdeck.scan import scan_file
from tests.conftest import real_file

ROWS = [{"messages": [{"role": "user", "content": "héllo"}]}, {"conversations": [], "id": 2}]


def _jsonl(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)


@pytest.mark.parametrize(
    "name,data,container",
    [
        ("a.jsonl", _jsonl(ROWS), "jsonl"),
        ("crlf.jsonl", b"\xef\xbb\xbf" + _jsonl(ROWS).replace(b"\n", b"\r\n\r\n"), "jsonl"),
        ("nofinal.jsonl", _jsonl(ROWS).rstrip(b"\n"), "jsonl"),
        ("a.json", json.dumps(ROWS, indent=2).encode(), "json-array"),
        (
            "one.json",
            json.dumps(ROWS[0], indent=2).encode() + b"\n" + json.dumps(ROWS[1], indent=2).encode(),
            "json",
        ),
        ("a.jsonl.gz", gzip.compress(_jsonl(ROWS)), "jsonl"),
        ("a.json.zst", zstandard.ZstdCompressor().compress(json.dumps(ROWS).encode()), "json-array"),
        ("bare.json", _jsonl(ROWS), "jsonl"),  # JSONL content under a .json name
    ],
)
def test_every_container_yields_the_same_rows(tmp_path: Path, name: str, data: bytes, container: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with RowReader(path) as reader:
        rows = list(reader)
        assert reader.container == container
    assert [r.value for r in rows] == ROWS
    assert all(r.error is None for r in rows)


def test_jsonl_errors_name_file_line_and_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": \n\xff\xfe{"b"}\n{"a": 2}\n{"trunc')
    rows = list(iter_rows(path))
    assert [(r.line, r.error) for r in rows] == [
        (1, None),
        (2, "json_error"),
        (3, "encoding_error"),
        (4, None),
        (5, "json_error"),
    ]
    assert "truncated" in (rows[-1].reason or "")
    assert rows[1].where == f"{path}:2"


def test_oversize_row_is_skipped_without_holding_it(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    big = json.dumps({"text": "x" * 5_000_000}).encode()
    path.write_bytes(b'{"a": 1}\n' + big + b'\n{"a": 2}\n')
    rows = list(iter_rows(path, max_row_bytes=1_000_000))
    assert [r.error for r in rows] == [None, "oversize_row", None]
    assert rows[1].nbytes == len(big) + 1 and "exceeds the limit" in (rows[1].reason or "")


def test_truncated_json_array_reports_where_it_broke(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(json.dumps(ROWS * 3).encode()[:-30])
    rows = list(iter_rows(path))
    assert [r.error for r in rows[:-1]] == [None] * (len(rows) - 1)
    assert rows[-1].error == "json_error" and f"after record {len(rows) - 1}" in (rows[-1].reason or "")


class TestScan:
    def test_counts_keysets_and_errors(self, tmp_path: Path) -> None:
        path = tmp_path / "s.jsonl"
        path.write_bytes(_jsonl(ROWS) + b"[1, 2]\nnope\n")
        report = scan_file(path)
        assert (report.rows_in, report.rows_out) == (4, 2)
        assert report.rejected == {"not_an_object": 1, "json_error": 1}
        assert report.extra["keysets"] == [
            {"keys": ["messages"], "rows": 1},
            {"keys": ["conversations", "id"], "rows": 1},
        ]
        assert report.extra["bytes"] == path.stat().st_size

    def test_empty_file_fails_with_a_clear_message(self, tmp_path: Path) -> None:
        (tmp_path / "e.jsonl").write_bytes(b"")
        with pytest.raises(JobFailed, match="empty input"):
            scan_file(tmp_path / "e.jsonl")

    def test_binary_file_fails_naming_the_reasons(self, tmp_path: Path) -> None:
        (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 64)
        with pytest.raises(
            JobFailed, match=r"no row parsed out of \d+ \(\d+ (encoding_error|json_error)"
        ) as info:
            scan_file(tmp_path / "b.bin")
        assert info.value.report.rows_out == 0

    def test_fifty_megabyte_single_line_parses(self, tmp_path: Path) -> None:
        path = tmp_path / "one-line.jsonl"
        path.write_text(json.dumps({"messages": [{"role": "user", "content": "y" * 50_000_000}]}))
        report = scan_file(path)
        assert (report.rows_in, report.rows_out) == (1, 1)

    def test_missing_file_and_directory(self, tmp_path: Path) -> None:
        with pytest.raises(InputError, match="no such file"):
            scan_file(tmp_path / "missing.jsonl")
        with pytest.raises(InputError, match="is a directory"):
            scan_file(tmp_path)

    def test_real_single_object_file(self) -> None:
        report = scan_file(real_file("axolotl__conversation.json"))
        assert report.rows_out == 1 and report.extra["container"] == "json"

    def test_real_jsonl_with_blank_lines(self) -> None:
        report = scan_file(real_file("LLaMA-Factory__training_data.jsonl"))
        assert (report.rows_in, report.rows_out) == (10, 10)


class TestPaths:
    def test_inside_roots_resolves(self, tmp_path: Path) -> None:
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "f.jsonl").write_text("{}")
        assert resolve_in_roots("d/f.jsonl", [tmp_path]) == (tmp_path / "d" / "f.jsonl").resolve()

    def test_dotdot_and_symlinks_out_of_roots_are_refused(self, tmp_path: Path) -> None:
        root = tmp_path / "root"
        root.mkdir()
        (tmp_path / "secret").write_text("x")
        (root / "link").symlink_to(tmp_path / "secret")
        for bad in ("../secret", "link", "/etc/passwd"):
            with pytest.raises(PathNotAllowedError, match="outside the data roots"):
                resolve_in_roots(bad, [root])

    def test_missing_path_inside_roots(self, tmp_path: Path) -> None:
        with pytest.raises(PathNotAllowedError, match="no such file"):
            resolve_in_roots("nope.jsonl", [tmp_path])


def test_relative_paths_are_from_the_current_folder_else_the_first_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, home = tmp_path / "data", tmp_path / "var"
    data.mkdir()
    home.mkdir()
    (data / "train.jsonl").write_text("{}")
    (home / "made.jsonl").write_text("{}")
    monkeypatch.chdir(tmp_path)
    roots = [data, home]
    assert resolve_in_roots("data/train.jsonl", roots) == (data / "train.jsonl").resolve()  # from the cwd
    assert resolve_in_roots("train.jsonl", roots) == (data / "train.jsonl").resolve()  # from the first root
    assert resolve_in_roots("var/made.jsonl", roots) == (home / "made.jsonl").resolve()  # a later root
    with pytest.raises(PathNotAllowedError, match="no such file"):  # never searched for in a later root
        resolve_in_roots("made.jsonl", roots)
    assert (
        resolve_in_roots("out/new.jsonl", roots, must_exist=False) == (data / "out" / "new.jsonl").resolve()
    )
    with pytest.raises(PathNotAllowedError, match="outside the data roots"):
        resolve_in_roots("../../x.jsonl", roots, must_exist=False)
