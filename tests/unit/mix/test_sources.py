"""A mix's source names: kept in provenance through every writer, stored in the shards' mix_source
column, counted in the statistics, shown on the dataset pages, and used by training's and eval's
per-source figures (shards written before the column read as "")."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from draftdeck.convert import convert
from draftdeck.convert.fast import plain_row
from draftdeck.drafter.eval.evaluate import read_prompts
from draftdeck.drafter.train.data import TrainData
from draftdeck.formats.model import PROVENANCE_KEY, Conversation, Message, SourceRef
from draftdeck.formats.writers import to_openai
from draftdeck.quality import Report
from draftdeck.shards.stats import Stats
from draftdeck.shards.store import ShardDataset, row_mix_source
from tests.support.web import form_token

ANSWER = "an answer long enough not to be a placeholder candidate"


def _row(i: int, source: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": [{"role": "user", "content": f"question {i}"},
                                        {"role": "assistant", "content": f"{ANSWER} {i}"}]}  # fmt: skip
    if source is not None:
        row[PROVENANCE_KEY] = {"file": f"/orig/{source}.jsonl", "row": i + 1, "source": source}
    return row


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


def test_every_writer_keeps_the_mix_source_and_adds_none(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "mixed.jsonl", [_row(0, "chat"), _row(1, None)])
    parquet = tmp_path / "mixed.parquet"
    convert([src], parquet, "parquet")  # the general path: the source rides in `meta`
    again = tmp_path / "again.jsonl"
    convert([parquet], again, "sharegpt")
    first, second = (r[PROVENANCE_KEY] for r in _lines(again))
    assert first == {"file": "/orig/chat.jsonl", "row": 1, "source": "chat"}
    assert second == {"file": str(src), "row": 2}  # not from a mix: no source key
    # the convert workers' fast path writes what the general path does
    for row, origin in ((_row(0, "chat"), ("x", 1)), (_row(1, None), ("x", 2))):
        fast = plain_row(row, "openai", 24, False, origin)
        assert fast is not None
        kept = {k: v for k, v in row.items() if k == PROVENANCE_KEY}
        conv = Conversation([Message("user", "q"), Message("assistant", ANSWER)], meta=kept)
        conv.source = SourceRef("x", origin[1])
        assert orjson.loads(fast[1])[PROVENANCE_KEY] == to_openai(conv)[PROVENANCE_KEY]
    # a malformed name is not kept (regeneration writes through to_openai too)
    odd = Conversation([Message("user", "q")], source=SourceRef("f", 3),
                       meta={PROVENANCE_KEY: {"file": "/o", "row": 1, "source": 7}})  # fmt: skip
    assert odd.mix_source == "" and to_openai(odd)[PROVENANCE_KEY] == {"file": "/o", "row": 1}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset tokenized from a file whose rows name two mix sources, and two rows from no mix."""
    from draftdeck.chat.testing import small_bpe_tokenizer
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files

    root = tmp_path_factory.mktemp("mixed")
    rows = [_row(i, ("chat", "code", None)[i % 3] if i < 6 else "chat") for i in range(10)]
    src = _jsonl(root / "mixed.jsonl", rows)
    out = root / "ds"
    tokenize_files([src], out, TokenizeOptions(small_bpe_tokenizer(), workers=1, shard_rows=4))
    return out


def test_shards_name_each_rows_mix_source_and_the_statistics_balance(mixed: Path) -> None:
    from draftdeck.browse.info import load_info, stats_payload

    ds = ShardDataset(mixed)
    names = [row_mix_source(ds.row(n)) for n in range(len(ds))]
    assert sorted(names) == [""] * 2 + ["chat"] * 6 + ["code"] * 2
    assert ds.column("mix_source") is not None
    stats = json.loads((mixed / "stats.json").read_text())
    by = stats["mix_sources"]
    assert {k: v["rows"] for k, v in by.items()} == {"chat": 6, "code": 2}
    lengths, trained = ds.lengths(), ds.n_trained()
    for name, counts in by.items():
        rows = [n for n in range(len(ds)) if names[n] == name]
        assert counts["tokens"] == sum(int(lengths[n]) for n in rows)
        assert counts["trained_tokens"] == sum(int(trained[n]) for n in rows)
    unnamed = [n for n in range(len(ds)) if not names[n]]
    assert sum(v["tokens"] for v in by.values()) + sum(int(lengths[n]) for n in unnamed) == stats["tokens"]
    shown = stats_payload(load_info(mixed))["per_mix_source"]
    assert [s["name"] for s in shown] == ["chat", "code"]
    assert shown[0]["row_share"] == pytest.approx(0.6)
    assert shown[1]["mean_tokens"] == pytest.approx(by["code"]["tokens"] / 2)
    assert shown[1]["trained_share"] == pytest.approx(by["code"]["trained_tokens"] / stats["trained_tokens"])
    # a chunk's saved statistics keep them, and merge
    s = Stats(8)
    s.mix_sources = {"chat": {"rows": 2, "tokens": 9, "trained_tokens": 4}}
    merged = Stats(8)
    for _ in range(2):
        s.save_state(mixed.parent / "state.npz")
        merged.merge(Stats.load_state(mixed.parent / "state.npz"))
    assert merged.mix_sources == {"chat": {"rows": 4, "tokens": 18, "trained_tokens": 8}}


def _without_column(ds_dir: Path, to: Path) -> Path:
    """A copy of a dataset as shards of before the mix_source column."""
    shutil.copytree(ds_dir, to)
    for f in to.glob("data-*.arrow"):
        table = pa.ipc.open_stream(f.read_bytes()).read_all().drop_columns(["mix_source"])
        with pa.OSFile(str(f), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    return to


def test_training_and_eval_group_rows_by_mix_source_else_file(mixed: Path) -> None:
    data = TrainData([mixed], heldout_fraction=0.0)
    src = str(mixed.parent / "mixed.jsonl")  # the rows from no mix: their file
    assert {data.source(r) for r in data.train} == {"chat", "code", src}
    prompts = read_prompts(mixed, None, 100, Report(), heldout_fraction=1.0)
    assert sorted({p.source for p in prompts}) == sorted({data.source(r) for r in data.train})
    old = _without_column(mixed, mixed.parent / "old")
    assert {row_mix_source(ShardDataset(old).row(n)) for n in range(10)} == {""}
    old_data = TrainData([old], heldout_fraction=0.0)
    assert {old_data.source(r) for r in old_data.train} == {"/orig/chat.jsonl", "/orig/code.jsonl", src}


def test_a_jsonl_prompt_file_is_grouped_by_provenance(tmp_path: Path, mixed: Path) -> None:
    from draftdeck.chat.render import load_tokenizer
    from draftdeck.chat.testing import small_bpe_tokenizer

    rows = [_row(0, "chat"), _row(1, None)]
    rows[1][PROVENANCE_KEY] = {"file": "/orig/plain.jsonl", "row": 4}
    rows.append(_row(2, None))
    src = _jsonl(tmp_path / "p.jsonl", rows)
    prompts = read_prompts(src, load_tokenizer(small_bpe_tokenizer()), 10, Report())
    assert [p.source for p in prompts] == ["chat", "/orig/plain.jsonl", str(src)]


# -- pages ---------------------------------------------------------------------------------------------


@pytest.fixture
def client(migrated: Path) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from app.web.main import create_app

    with TestClient(create_app()) as c:
        c.get("/datasets")  # sets the CSRF cookie
        yield c


def _register(client: Any, path: Path) -> int:
    r = client.post("/datasets", data={"path": str(path), "csrf": form_token(client)},
                    follow_redirects=False)  # fmt: skip
    assert r.status_code == 303, r.text
    return int(r.headers["location"].rsplit("/", 1)[1])


def test_dataset_pages_show_mix_sources_escaped_and_only_when_there_are(
    client: Any, migrated: Path, mixed: Path
) -> None:
    ds_dir = shutil.copytree(mixed, migrated / "data" / "mixed")
    stats = json.loads((ds_dir / "stats.json").read_text())
    stats["mix_sources"]["<b>web</b>"] = stats["mix_sources"].pop("code")
    (ds_dir / "stats.json").write_text(json.dumps(stats))
    ds_id = _register(client, ds_dir)
    for url in (f"/datasets/{ds_id}", f"/datasets/{ds_id}/stats"):
        html = client.get(url).text
        table = html.split('id="mix-sources"', 1)[1].split("</table>", 1)[0]
        assert '<td>chat</td><td class="num">6</td><td class="num">60.0 %</td>' in table
        assert "&lt;b&gt;web&lt;/b&gt;" in table and "<b>web</b>" not in html
    stats.pop("mix_sources")
    (ds_dir / "stats.json").write_text(json.dumps(stats))
    for url in (f"/datasets/{ds_id}", f"/datasets/{ds_id}/stats"):
        assert 'id="mix-sources"' not in client.get(url).text


def test_the_run_page_shows_the_latest_evals_real_tau_per_source(client: Any) -> None:
    from sqlmodel import Session

    from app.settings import get_settings
    from app.store.db import get_engine
    from app.store.metrics import record_metrics
    from tests.support.run import make_eval, make_run

    jobs = get_settings().jobs_dir
    with Session(get_engine(), expire_on_commit=False) as s:
        run = make_run(s, jobs, steps=120)
        for name in ("chat", "code"):
            src = f"heldout/source/{name}"
            record_metrics(s, run, 100, {f"{src}/walked/accepted": 300.0, f"{src}/walked/steps": 200.0,
                                         f"{src}/target_walked/accepted": 100.0,
                                         f"{src}/target_walked/steps": 200.0}, None)  # fmt: skip
        older = make_eval(s, jobs, run, 100, real_tau=1.5, data_tau=2.5, target_tau=1.5)
        newer = make_eval(s, jobs, run, 100, real_tau=1.5, data_tau=2.5, target_tau=1.5)
    for ev, by in ((older, {"chat": (100, 100)}), (newer, {"chat": (150, 100), "<i>web</i>": (40, 80)})):
        path = jobs / str(ev) / "eval.json"
        data = json.loads(path.read_text())
        data["eval"]["by_source"] = {k: {"prompts": 2, "accepted": a, "steps": n} for k, (a, n) in by.items()}
        path.write_text(json.dumps(data))
    html = client.get(f"/runs/{run}", headers={"accept": "text/html"}).text
    table = html.split('id="truth-sources"', 1)[1].split("</table>", 1)[0]
    assert "τ real (eval, incl. bonus)" in table
    cells = {r.split("</td>", 1)[0].rsplit(">", 1)[1]: r.split("</tr>")[0] for r in table.split("<tr>")[2:]}
    assert cells["chat"].endswith('<td class="num">2.500</td>')  # the newer eval's, 1 + 150/100
    assert cells["code"].endswith('<td class="num">\u2013</td>')  # no eval figure for it: a dash
    assert cells["&lt;i&gt;web&lt;/i&gt;"].endswith('<td class="num">1.500</td>')


def test_a_reused_chunk_from_before_the_column_is_recut_with_it(mixed: Path, tmp_path: Path) -> None:
    """A tokenize retry may reuse chunks an older attempt wrote without mix_source: the recut
    shards all have today's schema, the old rows reading "" and the new keeping their names."""
    from draftdeck.shards.manifest import read_manifest
    from draftdeck.shards.store import schema
    from draftdeck.tokenize.chunks import recut

    old = _without_column(mixed, tmp_path / "old")
    parts = tmp_path / "parts"
    parts.mkdir()
    infos = []
    for i, folder in enumerate((old, mixed)):
        for s in read_manifest(folder).shards:
            name = f"chunk-{i}-{s.filename}"
            shutil.copy(folder / s.filename, parts / name)
            infos.append(s.__class__(name, s.rows, s.bytes, s.sha256))
    final = recut(parts, infos, shard_rows=8)
    tables = [pa.ipc.open_stream((parts / f.filename).read_bytes()).read_all() for f in final]
    assert all(t.schema.names == schema().names for t in tables)
    names = [n for t in tables for n in t.column("mix_source").to_pylist()]
    assert names[:10] == [""] * 10 and names[10:] == [
        row_mix_source(ShardDataset(mixed).row(n)) for n in range(10)
    ]
