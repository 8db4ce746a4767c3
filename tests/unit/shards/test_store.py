# ruff: noqa: F811 - pytest fixtures imported from tokenize_helpers
"""The Arrow shard store: load_from_disk layout, atomic shards, manifest, random access, statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftdeck.errors import InputError
from draftdeck.fileio import sha256_file
from draftdeck.shards.manifest import Manifest
from draftdeck.shards.stats import Stats
from draftdeck.shards.store import (
    COLUMNS,
    ShardDataset,
    ShardRow,
    ShardWriter,
    features,
    schema,
    write_metadata,
)
from draftdeck.shards.tools import draft_vocab
from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_conversations
from tests.support.tokenize import a, conv, small_dir, u  # noqa: F401


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, small_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("shards") / "ds"
    convs = [conv(u(f"question {i}"), a(f"answer {i} " * (1 + i % 9)), line=i + 1) for i in range(250)]
    tokenize_conversations(convs, out, TokenizeOptions(small_dir, shard_rows=100, workers=1))
    return out


def test_the_spelled_out_schema_is_what_datasets_writes_for_the_same_features() -> None:
    """store.py writes the schema and dataset_info's features itself (importing datasets costs a short
    command ~0.5 s): both must stay byte-for-byte what datasets makes of the same columns."""
    from datasets import Features, List, Value

    theirs = Features(
        {name: List(Value(d[0])) if isinstance(d, list) else Value(d) for name, d in COLUMNS.items()}
    )
    assert schema().equals(theirs.arrow_schema, check_metadata=True)
    assert features() == theirs.to_dict()
    assert Features.from_arrow_schema(schema()) == theirs


def test_load_from_disk_reads_the_shards_with_speculators_types(dataset: Path) -> None:
    import datasets

    ds = datasets.load_from_disk(str(dataset))
    assert len(ds) == 250
    assert ds.features["input_ids"].feature.dtype == "int32"
    assert ds.features["loss_mask"].feature.dtype == "int64"
    assert ds.features["seq_len"].dtype == "int64"
    assert set(ds.column_names) == {"input_ids", "loss_mask", "seq_len", "source", "source_row", "turn",
                                    "n_trained", "truncated", "issues", "mix_source"}  # fmt: skip
    assert ds.features["issues"].feature.dtype == "string" and ds.features["mix_source"].dtype == "string"
    mine = ShardDataset(dataset)
    for i in (0, 99, 100, 249):
        assert ds[i] == mine.row(i)
    assert sorted(p.name for p in dataset.glob("*.arrow")) == [
        f"data-0000{i}-of-00003.arrow" for i in range(3)
    ]


def test_manifest_lists_every_shard_with_checksums_and_parameters(dataset: Path) -> None:
    m = json.loads((dataset / "manifest.json").read_text())
    assert m["rows"] == 250 and [s["rows"] for s in m["shards"]] == [100, 100, 50]
    for s in m["shards"]:
        f = dataset / s["filename"]
        assert f.stat().st_size == s["bytes"] and sha256_file(f) == s["sha256"]
    assert len(m["tokenizer"]["fingerprint"]) == 64 and m["tokenizer"]["vocab_size"] > 0
    assert m["parameters"]["shard_rows"] == 100 and m["report"]["rows_out"] == 250
    assert "first character" in m["mask_rule"]
    assert not list(dataset.glob(".tmp-*"))


def test_random_access_and_bounds(dataset: Path) -> None:
    ds = ShardDataset(dataset, max_open=1)
    assert len(ds) == 250
    assert ds.locate(0) == (0, 0) and ds.locate(100) == (1, 0) and ds.locate(249) == (2, 49)
    r = ds.row(137)
    assert r["source_row"] == 138 and r["seq_len"] == len(r["input_ids"]) and r["turn"] == -1
    assert ds.row(3)["source_row"] == 4  # after another shard was opened and the first one evicted
    with pytest.raises(IndexError):
        ds.row(250)
    with pytest.raises(InputError, match="not a DraftDeck dataset"):
        ShardDataset(dataset.parent)


def test_stats_describe_the_whole_dataset(dataset: Path) -> None:
    s = json.loads((dataset / "stats.json").read_text())
    ds = ShardDataset(dataset)
    rows = [ds.row(i) for i in range(len(ds))]
    assert s["rows"] == 250 and s["tokens"] == sum(r["seq_len"] for r in rows)
    assert s["trained_tokens"] == sum(r["n_trained"] for r in rows)
    assert sum(b["rows"] for b in s["length_histogram"]) == 250
    assert sum(b["rows"] for b in s["trained_fraction_histogram"]) == 250
    [(source, per)] = s["sources"].items()
    assert source == "mem.jsonl" and per["rows"] == 250 and per["tokens"] == s["tokens"]
    counts = np.load(dataset / "trained_token_counts.npy")
    trained = np.concatenate([np.asarray(r["input_ids"])[np.asarray(r["loss_mask"]) == 1] for r in rows])
    assert np.array_equal(counts, np.bincount(trained, minlength=len(counts)))
    top = s["top_trained_tokens"][0]
    assert top["count"] == counts.max()


def test_draft_vocab_d2t_t2d(dataset: Path) -> None:
    counts = np.load(dataset / "trained_token_counts.npy")
    v = draft_vocab(dataset, 10)
    assert len(v.ids) == 10 and list(v.ids) == sorted(v.ids)
    assert set(v.ids) == set(np.argsort(-counts, kind="stable")[:10])
    assert np.array_equal(np.arange(10) + v.d2t, v.ids) and v.t2d.sum() == 10 and v.t2d[v.ids].all()
    assert 0 < v.coverage <= 1


def test_writer_is_atomic_and_discard_removes_shards(tmp_path: Path) -> None:
    w = ShardWriter(tmp_path, shard_rows=2)
    for i in range(5):
        w.add(ShardRow(np.arange(i + 2, dtype=np.int32), np.ones(i + 2, np.uint8), "f", i, -1, False))
    assert len(list(tmp_path.glob("part-*.arrow"))) == 2  # two full shards on disk, one row buffered
    w.discard()
    assert not list(tmp_path.iterdir())
    w = ShardWriter(tmp_path, shard_rows=2)
    w.add(ShardRow(np.arange(3, dtype=np.int32), np.array([0, 1, 1], np.uint8), "f", 0, -1, False))
    shards = w.close()
    stats = Stats(10)
    stats.add(np.arange(3), np.array([0, 1, 1]), "f")
    write_metadata(tmp_path, Manifest(shards, report={}))
    assert ShardDataset(tmp_path).row(0)["loss_mask"] == [0, 1, 1]


def test_the_manifest_the_job_writes_is_the_one_the_reader_parses(dataset: Path) -> None:
    from draftdeck.shards.manifest import Manifest, read_manifest

    m = read_manifest(dataset)
    assert m.rows == 250 and [s.rows for s in m.shards] == [100, 100, 50]
    assert m.tokenizer is not None and m.tokenizer.vocab_size and len(m.tokenizer.fingerprint) == 64
    assert m.parameters["shard_rows"] == 100 and m.report is not None and m.report["rows_out"] == 250
    assert Manifest.from_dict(m.to_dict()) == m == ShardDataset(dataset).manifest
    assert m.tokenizer_dir() == Path(m.tokenizer.path or "")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"format": "other"}, "format"),
        ({"version": 99}, "format version 99"),
        ({"shards": [{"filename": "a.arrow", "rows": -1, "bytes": 0, "sha256": ""}]}, r"shards\[0\]"),
        (
            {"shards": [{"filename": "../x.arrow", "rows": 1, "bytes": 0, "sha256": ""}]},
            r"shards\[0\].filename",
        ),
        ({"rows": 7}, "rows is 7 but the shards hold 250"),
        ({"tokenizer": {"path": "/t"}}, "tokenizer"),
        ({"tokenizer": {"path": 3, "fingerprint": "f"}}, "tokenizer.path"),
        ({"parameters": []}, "parameters"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_key(
    dataset: Path, tmp_path: Path, change: dict, named: str
) -> None:
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    body = {**json.loads((copy / "manifest.json").read_text()), **change}
    (copy / "manifest.json").write_text(json.dumps(body))
    with pytest.raises(InputError, match=named) as err:
        ShardDataset(copy)
    assert "manifest.json" in str(err.value)


def test_a_save_to_disk_folder_reads_through_the_same_reader(dataset: Path, tmp_path: Path) -> None:
    import datasets

    ours = datasets.load_from_disk(str(dataset))
    ours.select(range(120, 130)).save_to_disk(str(tmp_path / "peer"))
    peer = ShardDataset.open(tmp_path / "peer")
    assert not peer.written_by_draftdeck and len(peer) == 10
    assert [peer.row(i) for i in range(10)] == [ours[i] for i in range(120, 130)]
    assert peer.lengths().tolist() == [len(ours[i]["input_ids"]) for i in range(120, 130)]


def test_one_byte_decoder_equals_transformers_table() -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from draftdeck.tokenize.bytelevel import byte_decoder

    assert byte_decoder() == {c: b for b, c in bytes_to_unicode().items()}
