"""draftdeck.convert with worker processes: where files are cut into chunks (every byte read once, cuts at
newlines), the worker processes' lifecycle (inputs kept in the parent, a failing worker, a cancel, the
writer's thread) and the fast path for plain rows (the general path's bytes). test_parallel.py holds
the same-bytes-and-report comparisons."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftdeck.convert import ConvertOptions, convert
from draftdeck.formats.readers import JsonlRange, RowReader, jsonl_chunks
from tests.conftest import FIXTURES as TEST_FIXTURES
from tests.support.convert import general_row
from tests.support.convert_parallel import chat_row, convert_both, mixed_file, mixed_rows

FIXTURES = TEST_FIXTURES / "formats"


def test_chunks_cover_the_file_and_end_at_newlines(tmp_path: Path) -> None:
    src = mixed_file(tmp_path / "m.jsonl", n=300, seed=2, tail=b'{"no final newline": 1}')
    data = src.read_bytes()
    for size in (1, 7, 100, 1000, len(data) - 1, len(data), len(data) + 5):
        chunks = list(jsonl_chunks(src, size))
        assert chunks[0][0] == 0 and chunks[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
        assert all(data[e - 1 : e] == b"\n" for _, e in chunks[:-1])
        for s, e in chunks:  # every range is whole UTF-8 (but for the deliberately broken bytes)
            assert data[s:e].replace(b"\xff\xfe", b"").decode("utf-8")


def test_cut_inside_a_multibyte_character(tmp_path: Path) -> None:
    first = orjson.dumps(chat_row("€€€€ 中文 " * 20, "an answer with 🚀 and café " * 10)) + b"\n"
    rest = [orjson.dumps(chat_row(f"中文 {i}", f"日本語の答え {i} 🚀")) + b"\n" for i in range(40)]
    src = tmp_path / "utf8.jsonl"
    src.write_bytes(first + b"".join(rest))
    at = first.index("🚀".encode()) + 2  # the target cut falls inside the 4-byte emoji
    assert first[at - 1] >= 0x80 and first[at] >= 0x80
    chunks = list(jsonl_chunks(src, at))
    assert chunks[0] == (0, len(first))
    convert_both(tmp_path, [src], chunk_bytes=at)


def test_cut_right_at_a_newline(tmp_path: Path) -> None:
    rows = [orjson.dumps(chat_row(f"q{i}", f"answer number {i} is long")) + b"\n" for i in range(30)]
    src = tmp_path / "n.jsonl"
    src.write_bytes(b"".join(rows))
    size = len(rows[0])  # the target cut's last byte is the first row's newline
    chunks = list(jsonl_chunks(src, size))
    assert chunks[0] == (0, size)
    assert chunks[1][0] == size
    convert_both(tmp_path, [src], chunk_bytes=size)


def test_empty_chunks_of_blank_lines(tmp_path: Path) -> None:
    rows = [orjson.dumps(chat_row(f"q{i}", f"answer number {i} is long")) + b"\n" for i in range(20)]
    src = tmp_path / "blank.jsonl"
    src.write_bytes(b"".join(rows[:10]) + b"\n" * 5000 + b"".join(rows[10:]) + b"\n" * 3000)
    chunks = list(jsonl_chunks(src, 1000))
    empty = [c for c in chunks if not src.read_bytes()[c[0] : c[1]].strip()]
    assert len(empty) >= 3
    s, e = empty[0]
    r = JsonlRange(src, s, e, 1)
    assert list(r) == [] and r.newlines == e - s
    one, two = convert_both(tmp_path, [src], chunk_bytes=1000)
    assert one.rows_in == 20
    assert two.extra["parallel"]["chunks"] == len(chunks)


def test_range_reader_matches_the_whole_file_reader(tmp_path: Path) -> None:
    src = mixed_file(tmp_path / "m.jsonl", n=400, seed=9, tail=b"{truncated")
    with RowReader(src) as reader:
        whole = [(r.line, r.value, r.error, r.reason) for r in reader]
    parts: list[tuple[Any, ...]] = []
    first = 1
    for s, e in jsonl_chunks(src, 777):
        rng = JsonlRange(src, s, e, first)
        parts.extend((r.line, r.value, r.error, r.reason) for r in rng)
        first += rng.newlines
    assert parts == whole


def test_long_and_oversize_rows_across_chunks(tmp_path: Path) -> None:
    big = orjson.dumps(chat_row("big", "x" * 50_000)) + b"\n"
    huge = orjson.dumps(chat_row("huge", "y" * 200_000)) + b"\n"
    rows = [orjson.dumps(chat_row(f"q{i}", f"answer number {i} is long")) + b"\n" for i in range(30)]
    src = tmp_path / "long.jsonl"
    src.write_bytes(b"".join(rows[:10]) + big + b"".join(rows[10:20]) + huge + b"".join(rows[20:]))
    one, two = convert_both(tmp_path, [src], chunk_bytes=4096, max_row_bytes=100_000)
    assert one.rejected["oversize_row"] == 1
    assert [e.line for e in two.examples["oversize_row"]] == [22]


def test_small_and_non_jsonl_inputs_stay_in_the_parent(tmp_path: Path) -> None:
    src = mixed_file(tmp_path / "m.jsonl", n=50, seed=4)
    _, two = convert_both(tmp_path, [src, FIXTURES / "sharegpt.json"], chunk_bytes=10 << 20)
    assert two.extra["parallel"]["chunks"] == 0


def test_parquet_target_uses_one_process(tmp_path: Path) -> None:
    src = mixed_file(tmp_path / "m.jsonl", n=100, seed=4)
    report = convert(
        [src], tmp_path / "o.parquet", "parquet", options=ConvertOptions(workers=2, chunk_bytes=500)
    )
    assert "parallel" not in report.extra
    assert report.rows_out > 0


def test_cli_workers_option(dd_home: Path) -> None:

    from typer.testing import CliRunner

    from draftdeck.cli import app

    data = dd_home / "data"
    src = data / "big.jsonl"
    rows = mixed_rows(random.Random(8), 2000)
    with open(src, "wb") as f:
        for i in range(16):  # > 4 MiB (one chunk) so that the pool is used; repeated rows are duplicates
            f.write(b"".join(rows) + f'{{"question": "{i}"}}\n'.encode())
    assert src.stat().st_size > 4 << 20
    reports = []
    for workers in ("1", "2"):
        out, rep = data / f"o{workers}.jsonl", data / f"r{workers}.json"
        args = ["convert", str(src), "--to", "sharegpt", "--out", str(out), "--report", str(rep)]
        result = CliRunner().invoke(app, [*args, "--workers", workers])
        assert result.exit_code == 0, result.output
        d = json.loads(rep.read_text())
        assert d.pop("parallel", None) == ({"workers": 2, "chunks": 2} if workers == "2" else None)
        d.pop("elapsed_s")
        d["outputs"] = [{k: v for k, v in o.items() if k != "path"} for o in d["outputs"]]
        reports.append(d)
    assert reports[0] == reports[1]
    assert (data / "o1.jsonl").read_bytes() == (data / "o2.jsonl").read_bytes()
    assert (
        CliRunner()
        .invoke(app, ["convert", str(src), "--to", "openai", "--out", "x", "--workers", "0"])
        .exit_code
        == 2
    )


def test_a_failing_worker_is_an_error_not_a_hang(tmp_path: Path) -> None:
    from draftdeck.convert.workers import WorkerError, Workers

    src = mixed_file(tmp_path / "m.jsonl", n=50, seed=4)
    workers = Workers(ConvertOptions(workers=2), "openai")
    try:
        workers.send((str(src), "m.jsonl", 0, src.stat().st_size, 1))  # from line 1
        workers.send((str(tmp_path / "gone.jsonl"), "gone.jsonl", 0, 10, 1))
        assert workers.receive().kinds  # the first worker converted its range
        with pytest.raises(WorkerError, match="FileNotFoundError"):
            workers.receive()
    finally:
        workers.close()
    assert not any(p.is_alive() for p in workers.procs)


def test_writer_thread_error_leaves_no_file(tmp_path: Path) -> None:
    """The writer hashes and writes on its own thread: an error in the block still leaves nothing."""
    from draftdeck.formats.writers import Writer

    out = tmp_path / "o.jsonl"
    line = orjson.dumps({"conversations": [{"from": "human", "value": "x" * 1000}]}) + b"\n"
    with pytest.raises(RuntimeError), Writer(out, "sharegpt") as w:
        for _ in range(5000):  # ~5 MB: several blocks in flight on the thread
            w.write_line(line)
        raise RuntimeError("stop")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert w._thread is None
    with Writer(out, "sharegpt") as w:
        for _ in range(5000):
            w.write_line(line)
    assert out.read_bytes() == line * 5000
    assert w.output is not None and w.output.bytes == len(line) * 5000
    import hashlib

    assert w.output.sha256 == hashlib.sha256(line * 5000).hexdigest()


# -- the fast path for plain rows --------------------------------------------------------------------------
_ROLES = st.sampled_from(
    ["user", "assistant", "system", "developer", "tool", "gpt", "human", "bot", "function_call"]
)


_TEXTS = st.sampled_from(
    ["", "  ", "hi", " padded answer that is long enough to not be a placeholder candidate ", "OK.",
     "<think>r</think>a long enough answer after the reasoning block, really long", "x" * 120,
     "<tool_call>{}</tool_call> and a long enough tail for the placeholder rule", "中文 " * 40, 7]
)  # fmt: skip


@st.composite
def _plain_ish(draw: st.DrawFn) -> Any:
    """A valid plain conversation (OpenAI or ShareGPT), then up to three perturbations of any kind."""
    sharegpt = draw(st.booleans())
    rk, tk = ("from", "value") if sharegpt else ("role", "content")
    user, gpt = ("human", "gpt") if sharegpt else ("user", "assistant")
    turns: list[dict[str, Any]] = [{rk: "system", tk: "be brief"}] if draw(st.booleans()) else []
    for i in range(draw(st.integers(1, 3))):
        turns += [{rk: user, tk: f"question {i}"}, {rk: gpt, tk: f"an answer long enough, number {i}"}]
    row: dict[str, Any] = {"conversations" if sharegpt else "messages": turns}
    for _ in range(draw(st.integers(0, 3))):
        what = draw(st.integers(0, 4))
        at = draw(st.integers(0, len(turns) - 1))
        if what == 0:
            turns[at][rk] = draw(_ROLES)
        elif what == 1:
            turns[at][tk] = draw(_TEXTS)
        elif what == 2:
            turns[at]["name"] = "n"
        elif what == 3:
            del turns[at]
            if not turns:
                break
        else:
            key = draw(st.sampled_from(["id", "system", "tools", "conversations", "messages", "x"]))
            row[key] = draw(st.sampled_from(["", "s", None, "[]", 3]))
    return row


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=_plain_ish(), to=st.sampled_from(["sharegpt", "openai"]))
def test_plain_row_fast_path_is_the_general_path(row: Any, to: str) -> None:
    from draftdeck.convert.fast import plain_row

    fast = plain_row(row, to, 24, True)
    if fast is not None:  # whenever the fast path answers, it answers what the general path does
        assert fast == general_row(row, to)


def test_plain_row_fast_path_takes_the_usual_rows() -> None:
    from draftdeck.convert.fast import plain_row

    answer = "a long enough answer " * 3
    for row in (
        chat_row("q", answer, id=3),
        {"system": "s", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": answer}]},
        {"messages": [{"role": "developer", "content": "d"}, *chat_row(" q ", answer)["messages"]]},
    ):
        for to in ("sharegpt", "openai"):
            fast = plain_row(row, to, 24, True)
            assert fast is not None and fast == general_row(row, to)
    assert plain_row(chat_row("q", "OK."), "sharegpt", 24, True) is None  # a placeholder candidate


def test_cancel_mid_run_stops_workers_and_leaves_no_file(tmp_path: Path) -> None:
    import multiprocessing

    from draftdeck.errors import Cancelled

    src = mixed_file(tmp_path / "m.jsonl", n=1500, seed=6)
    seen: list[int] = []

    def progress(done: int, total: int | None = None, unit: str = "rows") -> None:
        seen.append(done)
        if len(seen) == 3:
            raise Cancelled("stop")

    out = tmp_path / "o.jsonl"
    with pytest.raises(Cancelled):
        convert(
            [src], out, "sharegpt", options=ConvertOptions(workers=2, chunk_bytes=2000), progress=progress
        )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]
    assert multiprocessing.active_children() == []
    assert seen == sorted(seen) and seen[-1] < src.stat().st_size
