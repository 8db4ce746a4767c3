"""Writers (OpenAI / ShareGPT JSONL, Parquet) and columnar readers (Parquet, Arrow IPC, save_to_disk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdeck.convert import ConvertOptions, convert, read_conversations
from draftdeck.errors import InputError
from draftdeck.formats.common import ParseContext
from draftdeck.formats.detect import parse
from draftdeck.formats.model import Conversation, Message, ToolCall
from draftdeck.formats.writers import Writer, to_openai, to_sharegpt
from draftdeck.quality import Report
from tests.conftest import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "formats"


def _reparse(row: dict[str, Any]) -> Conversation:
    [conv] = parse(orjson.loads(orjson.dumps(row)), ParseContext())[1]
    return conv


def _key(conv: Conversation) -> tuple:
    return (
        [
            (
                m.role,
                m.content,
                m.reasoning,
                [(c.name, c.arguments, c.raw_arguments, c.id) for c in m.tool_calls],
                m.tool_call_id,
                m.name,
            )
            for m in conv.messages
        ],
        conv.tools,
        conv.meta,
    )


# -- OpenAI -> ShareGPT -> OpenAI is lossless ----------------------------------------------------------
json_args = st.dictionaries(
    st.text(max_size=5),
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=10),
    max_size=3,
)


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


tool_calls = st.builds(
    ToolCall,
    name=st.text(min_size=1, max_size=8),
    arguments=json_args,
    raw_arguments=st.none(),
    id=st.none() | st.text(min_size=1, max_size=6),
) | st.builds(
    ToolCall,
    name=st.text(min_size=1, max_size=8),
    arguments=st.none(),
    # raw text is what a reader keeps when the source's arguments are NOT valid JSON ("{}" is parsed)
    raw_arguments=st.text(max_size=10).map(lambda t: "{" + t).filter(lambda t: not _is_json(t)),
    id=st.none(),
)
texts = st.text(max_size=40).filter(lambda t: "<think>" not in t)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    msg = Message(role, draw(texts))  # type: ignore[arg-type]
    if role == "assistant":
        msg.reasoning = draw(st.none() | st.text(min_size=1, max_size=20))
        msg.tool_calls = draw(st.lists(tool_calls, max_size=2))
    if role == "tool":
        msg.tool_call_id = draw(st.none() | st.text(min_size=1, max_size=6))
    msg.name = draw(st.none() | st.text(min_size=1, max_size=6))
    return msg


conversations = st.builds(
    Conversation,
    messages=st.lists(messages(), min_size=1, max_size=6),
    tools=st.lists(
        st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.text(max_size=6)})}
        ),
        max_size=2,
    ),
    meta=st.dictionaries(
        st.sampled_from(["id", "category", "score"]),
        st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
        max_size=2,
    ),
)


@settings(max_examples=300, deadline=None)
@given(conv=conversations)
def test_openai_sharegpt_openai_is_lossless(conv: Conversation) -> None:
    first = to_openai(conv)
    via_sharegpt = _reparse(to_sharegpt(_reparse(first)))
    assert to_openai(via_sharegpt) == first
    assert _key(_reparse(first)) == _key(conv)


def test_roundtrip_of_the_fixtures(tmp_path: Path) -> None:
    paths = [FIXTURES / n for n in ("openai_mixed.jsonl", "sharegpt.json", "trajectory.json", "tree.jsonl")]
    convert(paths, tmp_path / "a.jsonl", "openai")
    convert([tmp_path / "a.jsonl"], tmp_path / "b.jsonl", "sharegpt")
    convert([tmp_path / "b.jsonl"], tmp_path / "c.jsonl", "openai")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "c.jsonl").read_bytes()
    rows = [orjson.loads(line) for line in (tmp_path / "b.jsonl").read_bytes().splitlines()]
    assert {t["from"] for r in rows for t in r["conversations"]} == {"system", "human", "gpt", "tool"}
    calls = [t for r in rows for t in r["conversations"] if t.get("tool_calls")]
    assert calls and all(isinstance(c["tool_calls"][0]["function"]["arguments"], str) for c in calls)


def test_meta_colliding_with_format_keys_is_reported(tmp_path: Path) -> None:
    src = tmp_path / "i.jsonl"
    src.write_bytes(
        orjson.dumps(
            {
                "messages": "not the messages",
                "conversations": [
                    {"from": "human", "value": "q"},
                    {"from": "gpt", "value": "a long enough answer"},
                ],
            }
        )
        + b"\n"
    )
    report = convert([src], tmp_path / "o.jsonl", "openai")
    assert report.warnings == {"unrepresentable_field": 1}
    assert "'messages'" in report.examples["unrepresentable_field"][0].reason
    row = orjson.loads((tmp_path / "o.jsonl").read_bytes())
    assert row["messages"][1]["content"] == "a long enough answer"


def test_integers_beyond_64_bits_are_written(tmp_path: Path) -> None:
    # The readers reject such numbers (json_error); a conversation built in code may still hold one.
    conv = Conversation([Message("user", "q")], meta={"id": 123456789012345678901234567890})
    with Writer(tmp_path / "o.jsonl", "sharegpt") as w:
        w.write(conv)
    assert b'"id":123456789012345678901234567890' in (tmp_path / "o.jsonl").read_bytes()
    with Writer(tmp_path / "o.parquet", "parquet") as w:
        w.write(conv)
    assert (
        pq.read_table(tmp_path / "o.parquet").column("meta")[0].as_py()
        == '{"id":123456789012345678901234567890}'
    )


def test_writer_is_atomic(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    with pytest.raises(RuntimeError), Writer(out, "openai") as w:
        w.write(Conversation([Message("user", "q")]))
        raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


# -- Parquet, Arrow, save_to_disk ----------------------------------------------------------------------
def test_parquet_output_reads_back_identically(tmp_path: Path) -> None:
    paths = sorted(p for p in FIXTURES.iterdir() if p.name != "unknown_keys.jsonl")
    opts = ConvertOptions(allow_prompt_only=True)
    report = convert(paths, tmp_path / "o.parquet", "parquet", options=opts)
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.num_rows == report.rows_out == report.outputs[0].rows
    convert([tmp_path / "o.parquet"], tmp_path / "via.jsonl", "openai", options=opts)
    convert(paths, tmp_path / "direct.jsonl", "openai", options=opts)
    assert (tmp_path / "via.jsonl").read_bytes() == (tmp_path / "direct.jsonl").read_bytes()


ROWS = [
    {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "answer one"}]},
    {"messages": [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "answer two"}]},
    {"messages": [{"role": "user", "content": "q3"}]},
]


def test_foreign_parquet_streamed_by_batches(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": f"answer number {i}"},
            ]
        }
        for i in range(2000)
    ]
    rows += [{"messages": [{"role": "user", "content": "prompt only"}]}] * 100
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=500)
    assert pq.ParquetFile(path).metadata.num_row_groups == 5
    convs, report = _read(path)
    assert report.rows_in == 2100
    assert report.rejected == {"no_assistant_turn": 100}
    assert len(convs) == 2000
    assert convs[1999].messages[1].content == "answer number 1999"


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_arrow_ipc(tmp_path: Path, kind: str) -> None:
    table = pa.Table.from_pylist(ROWS)
    path = tmp_path / "t.arrow"
    with pa.OSFile(str(path), "wb") as sink:
        new = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
        with new(sink, table.schema) as writer:
            writer.write_table(table)
    convs, report = _read(path)
    assert [c.messages[1].content for c in convs] == ["answer one", "answer two"]
    assert report.rejected == {"no_assistant_turn": 1}
    assert report.examples["no_assistant_turn"][0].reason.startswith("record 2: ")


def test_datasets_save_to_disk_folder(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    datasets.Dataset.from_list(ROWS[:2]).save_to_disk(str(folder))
    convs, _ = _read(folder)
    assert [c.messages[1].content for c in convs] == ["answer one", "answer two"]
    ddict = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:1]), "test": datasets.Dataset.from_list(ROWS[1:2])}
    ).save_to_disk(str(ddict))
    convs, _ = _read(ddict)
    assert sorted(c.messages[0].content for c in convs) == ["q1", "q2"]


def test_a_plain_folder_is_read_as_its_data_files_by_name(tmp_path: Path) -> None:
    """A folder of files (as the picker shows them) is its data files and save_to_disk folders, in
    name order; notes, hidden files and other folders in it are not data (they were an error)."""
    import gzip

    import datasets

    from draftdeck.formats.tables import expand_inputs

    folder = tmp_path / "mix"
    folder.mkdir()
    (folder / "b.jsonl").write_bytes(orjson.dumps(ROWS[1]) + b"\n")
    (folder / "a.json.gz").write_bytes(gzip.compress(b"[" + orjson.dumps(ROWS[0]) + b"]"))
    saved = {"messages": [{"role": "user", "content": "q4"}, {"role": "assistant", "content": "answer four"}]}
    datasets.Dataset.from_list([saved]).save_to_disk(str(folder / "c_saved"))
    (folder / "README.md").write_text("# notes, not data\n")
    (folder / ".hidden.jsonl").write_bytes(b"not json\n")
    (folder / "nested").mkdir()
    (folder / "nested" / "d.jsonl").write_bytes(b"not json either\n")
    files = expand_inputs(folder)
    assert [f.relative_to(folder).parts[0] for f in files] == ["a.json.gz", "b.jsonl", "c_saved"]
    convs, report = _read(folder)
    assert [c.messages[1].content for c in convs] == ["answer one", "answer two", "answer four"]
    assert report.rows_in == 3 and not report.rejected


def test_a_folder_with_no_data_says_what_it_looked_for(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match=r"no data files in this folder \(looked for \.jsonl, \.ndjson"):
        _read(tmp_path)


def _read(path: Path) -> tuple[list[Conversation], Report]:
    report = Report()
    convs = list(read_conversations([path], report))
    report.rows_out = len(convs)
    report.check_accounting()
    return convs, report


# -- CSV, TSV ----------------------------------------------------------------------------------------
def test_csv_and_tsv_rows_are_read_by_their_header_as_text(tmp_path: Path) -> None:
    qa = tmp_path / "qa.csv"  # a quoted answer over two lines; a number that must stay text
    qa.write_text('instruction,output\n"What is 2+2?",4\n"Say ""hi""\nplease",hello\n', encoding="utf-8")
    convs, report = _read(qa)
    assert [[m.content for m in c.messages] for c in convs] == [
        ["What is 2+2?", "4"],
        ['Say "hi"\nplease', "hello"],
    ]
    assert report.formats == {"alpaca": 2}
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("query\tresponse\nHi there\tHello!\n", encoding="utf-8")
    assert [m.content for m in _read(tsv)[0][0].messages] == ["Hi there", "Hello!"]
    folder = tmp_path / "folder"  # a folder given as input reads them too
    folder.mkdir()
    qa.rename(folder / "qa.csv")
    assert len(_read(folder)[0]) == 2
    twice = tmp_path / "twice.csv"
    twice.write_text("output,output\na,b\n", encoding="utf-8")
    with pytest.raises(
        InputError, match=r"twice\.csv: the header row \['output', 'output'\] must name every"
    ):
        _read(twice)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["line", "lines", "block"]), st.integers(1, 40), st.integers(1, 600_000)),
        min_size=1,
        max_size=40,
    )
)
def test_lines_and_blocks_in_any_mix_write_the_same_bytes(calls: list[tuple[str, int, int]]) -> None:
    """write_line, write_lines and write_block (small blocks are buffered, large ones handed over
    whole) keep the order: the file, its sha256 and the row count are those of the lines one by one."""
    import hashlib
    import tempfile

    expected: list[bytes] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "o.jsonl"
        with Writer(out, "sharegpt") as w:
            for i, (how, rows, size) in enumerate(calls):
                lines = [b'{"n":%d,"x":"%s"}\n' % (i * 100 + k, b"y" * (size // rows)) for k in range(rows)]
                expected += lines
                if how == "line":
                    for line in lines:
                        w.write_line(line)
                elif how == "lines":
                    w.write_lines(lines, sum(map(len, lines)))
                else:
                    w.write_block(memoryview(b"".join(lines)), rows)
        data = b"".join(expected)
        assert out.read_bytes() == data
        assert w.output is not None
        assert (w.output.rows, w.output.bytes) == (len(expected), len(data))
        assert w.output.sha256 == hashlib.sha256(data).hexdigest()
