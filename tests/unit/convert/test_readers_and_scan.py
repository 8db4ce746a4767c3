"""Reading files of every container and scanning them, including the bad inputs of issue 2."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import zstandard

from draftdeck.convert.scan import scan_file
from draftdeck.errors import InputError, JobFailed, PathNotAllowedError
from draftdeck.formats.readers import RowReader, iter_rows
from draftdeck.paths import resolve_in_roots
from draftdeck.quality import Report
from tests.conftest import FIXTURES as TEST_FIXTURES
from tests.conftest import real_file

ROWS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "héllo"}]},
    {"conversations": [], "id": 2},
]


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
        ("a.jsonl.gz", gzip.compress(_jsonl(ROWS), mtime=0), "jsonl"),  # mtime 0: the same bytes each time
        ("a.json.zst", zstandard.ZstdCompressor().compress(json.dumps(ROWS).encode()), "json-array"),
        ("bare.json", _jsonl(ROWS), "jsonl"),  # JSONL content under a .json name
    ],
    ids=lambda v: v if isinstance(v, str) else "bytes",  # test ids: the same on every xdist worker
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


def scan_keeping_nothing(path: Path, **kwargs: Any) -> Any:
    """The report of a scan that fails because convert would keep none of the rows."""
    with pytest.raises(JobFailed, match="convert would keep none of the") as exc:
        scan_file(path, **kwargs)
    return exc.value.report


class TestScan:
    def test_counts_keysets_and_errors(self, tmp_path: Path) -> None:
        path = tmp_path / "s.jsonl"
        path.write_bytes(_jsonl(ROWS) + b"[1, 2]\nnope\n")
        report = scan_keeping_nothing(path)
        # rows_out is what convert would keep: a question without an answer and an empty conversation
        # are parsed rows convert rejects (before, scan called all parsed rows "out")
        assert (report.rows_in, report.rows_out) == (4, 0)
        assert report.rejected == {
            "not_an_object": 1,
            "json_error": 1,
            "no_assistant_turn": 1,
            "empty_conversation": 1,
        }
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
        assert isinstance(info.value.report, Report)
        assert info.value.report.rows_out == 0

    def test_fifty_megabyte_single_line_parses(self, tmp_path: Path) -> None:
        path = tmp_path / "one-line.jsonl"
        big = [{"role": "user", "content": "y" * 50_000_000}, {"role": "assistant", "content": "n"}]
        path.write_text(json.dumps({"messages": big}))
        report = scan_file(path)
        assert (report.rows_in, report.rows_out) == (1, 1)

    def test_missing_file_and_directory(self, tmp_path: Path) -> None:
        with pytest.raises(InputError, match="no such file"):
            scan_file(tmp_path / "missing.jsonl")
        with pytest.raises(InputError, match="no data files in this folder"):
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


FIXTURES = TEST_FIXTURES / "formats"


def _qa(question: str, answer: str | None) -> dict:
    turns = [{"role": "user", "content": question}]
    if answer is not None:
        turns.append({"role": "assistant", "content": answer})
    return {"messages": turns}


class TestScanPreflight:
    """scan says what convert would do: shapes, prompt-only rows, placeholders, rejections with examples."""

    def test_user_only_file_is_not_200_rows_out(self, tmp_path: Path) -> None:
        path = tmp_path / "prompts.jsonl"
        path.write_bytes(_jsonl([_qa(f"question {i}", None) for i in range(200)]))
        report = scan_keeping_nothing(path)
        assert (report.rows_in, report.rows_out) == (200, 0)  # was (200, 200)
        assert report.rejected == {"no_assistant_turn": 200}
        assert report.extra["prompt_only"] == 200
        assert report.formats == {"openai": 200}
        assert report.extra["would_keep"] == 0
        [item] = report.extra["would_reject"]
        assert item["code"] == "no_assistant_turn" and item["rows"] == 200
        assert item["example"]["file"] == str(path) and item["example"]["row"] == 1
        assert "prompt-only" in item["example"]["reason"]

    def test_shapes_placeholders_and_rejections_match_a_real_convert(self, tmp_path: Path) -> None:
        from draftdeck.convert import convert

        rows = [_qa(f"q{i}", "OK.") for i in range(40)]  # the dummy answer seeds pad prompts with
        rows += [_qa(f"yes or no {i}?", "Yes") for i in range(3)]  # short, repeated, under the threshold
        rows += [_qa("why is the sky blue?", "Rayleigh scattering of sunlight by the air.")]
        path = tmp_path / "mixed.jsonl"
        fixtures = ["dolly.jsonl", "swift_turn_pairs.jsonl", "multimodal.jsonl", "sharegpt_in_messages.jsonl"]
        path.write_bytes(_jsonl(rows) + b"".join((FIXTURES / f).read_bytes() for f in fixtures) + b"[1]\n")
        report = scan_file(path)
        converted = convert([path], tmp_path / "out.jsonl", "openai")
        # the scan's verdicts are convert's own, row for row
        assert (report.rows_in, report.rows_out, report.rows_expanded) == (
            converted.rows_in,
            converted.rows_out,
            converted.rows_expanded,
        )
        assert report.rejected == converted.rejected
        assert report.formats == converted.formats
        report.check_accounting()
        assert report.rejected == {
            "placeholder_response": 40,
            "multimodal_content": 1,  # audio
            "image_missing": 2,  # multimodal.jsonl's images are not there
            "not_an_object": 1,
        }
        assert report.formats == {
            "openai": 46,
            "instruction_response": 2,
            "turn_pairs": 2,
            "sharegpt": 1,
        }
        ph = report.extra["placeholder"]
        assert ph["flagged"] == {"answers": ["ok"], "rows": 40}
        assert ph["candidates"] == [{"answer": "yes", "rows": 3}]
        codes = {item["code"]: item for item in report.extra["would_reject"]}
        assert codes["image_missing"]["rows"] == 2
        assert "coco/train2017/000000033471.jpg" in codes["image_missing"]["example"]["reason"]
        assert codes["image_missing"]["example"]["row"] == 49
        assert "audios (1)" in codes["multimodal_content"]["example"]["reason"]
        assert report.extra["prompt_only"] == 0
        assert report.extra["would_keep"] == report.rows_out == 3 + 1 + 2 + 2 + 1 + 2

    def test_forced_format_rejects_other_shapes(self, tmp_path: Path) -> None:
        path = tmp_path / "two.jsonl"
        path.write_bytes((FIXTURES / "dolly.jsonl").read_bytes() + _jsonl([_qa("q", "a")]))
        report = scan_file(path, from_format="instruction_response")
        assert report.formats == {"instruction_response": 2}
        assert report.rejected == {"format_mismatch": 1}
        assert report.extra["from_format"] == "instruction_response"
        [item] = report.extra["would_reject"]
        assert item["example"]["row"] == 3 and "it reads as openai" in item["example"]["reason"]

    def test_a_named_pipe_is_read_once(self, tmp_path: Path) -> None:
        import os
        import threading

        fifo = tmp_path / "rows.jsonl"
        os.mkfifo(fifo)

        def feed() -> None:
            with open(fifo, "wb") as f:
                f.write(_jsonl([_qa("q", "a"), _qa("p", None)]))

        writer = threading.Thread(target=feed)
        writer.start()
        report = scan_file(fifo)
        writer.join(5)
        assert (report.rows_in, report.rows_out, report.extra["prompt_only"]) == (2, 1, 1)
        assert report.extra["keysets"] == [{"keys": ["messages"], "rows": 2}]

    def test_several_files_are_scanned_as_one_convert_reads_them(self, tmp_path: Path) -> None:
        from draftdeck.convert.scan_job import scan_files

        a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        a.write_bytes(_jsonl([_qa("q", "a long enough answer to not be a placeholder")]))
        alpaca = {"instruction": "name a colour", "output": "blue, as the sky on a clear day"}
        b.write_bytes(
            _jsonl([_qa("q", "a long enough answer to not be a placeholder"), _qa("x", None), alpaca])
        )
        report = scan_files([a, b], max_row_bytes=1 << 20)
        assert (report.rows_in, report.rows_out) == (4, 3)  # duplicates across files warn, as in convert
        assert report.warnings == {"duplicate_conversation": 1}
        assert [f["file"] for f in report.extra["files"]] == [str(a), str(b)]
        # each file's shapes: the report's, split where one file ends and the next begins
        assert [f["formats"] for f in report.extra["files"]] == [{"openai": 1}, {"openai": 2, "alpaca": 1}]
        assert report.extra["bytes"] == a.stat().st_size + b.stat().st_size
        assert report.extra["keysets"][0] == {"keys": ["messages"], "rows": 3}


def test_a_folder_scan_reads_csv_and_says_what_it_skipped(tmp_path: Path) -> None:
    from draftdeck.convert.scan import scan_paths

    (tmp_path / "qa.csv").write_text("instruction,output\nWhat is 2+2?,4\n", encoding="utf-8")
    (tmp_path / "qa.txt").write_text("notes\n", encoding="utf-8")
    (tmp_path / "older").mkdir()
    report = scan_paths([tmp_path])
    assert report.formats == {"alpaca": 1} and report.extra["container"] == "csv"
    assert report.extra["skipped"] == [
        {"file": str(tmp_path / "older"), "why": "a folder: folders are read only when given on their own"},
        {"file": str(tmp_path / "qa.txt"), "why": report.extra["skipped"][1]["why"]},
    ]
    assert report.extra["skipped"][1]["why"].startswith("not a data file (read: .jsonl")
