"""Dataset pages through FastAPI's TestClient on the embedded database: list, register, overview, alerts,
sample view (chips, escaping, filters, search, navigation), source conversation, statistics, compare,
delete, and the datasets migration."""

from __future__ import annotations

import html
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.support.datasets import (
    build_chat_dataset,
    build_tokenizer,
    encode_chat,
    load_tokenizer,
    write_dataset,
)
from tests.support.web import form_token


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


@pytest.fixture
def client(migrated: Path) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from app.web.main import create_app

    with TestClient(create_app()) as c:
        c.get("/datasets")  # sets the CSRF cookie
        yield c


@pytest.fixture
def chat(migrated: Path, tokenizer_dir: Path) -> dict[str, Path]:
    return build_chat_dataset(migrated, max_len=40, tokenizer_dir=tokenizer_dir)


def register(client: Any, path: Path | str) -> Any:
    return client.post("/datasets", data={"path": str(path), "csrf": form_token(client)},
                       follow_redirects=False)  # fmt: skip


def registered(client: Any, path: Path) -> int:
    r = register(client, path)
    assert r.status_code == 303, r.text
    return int(r.headers["location"].rsplit("/", 1)[1])


def shard_rows(ds_dir: Path) -> list[dict[str, Any]]:
    """Every row, read straight from the Arrow stream files (independent of the pages' reader)."""
    out: list[dict[str, Any]] = []
    for f in sorted(ds_dir.glob("data-*.arrow")):
        with pa.memory_map(str(f)) as src:
            out += pa.ipc.open_stream(src).read_all().to_pylist()
    return out


class Chips(HTMLParser):
    """The token chips of a page: one dict of attributes + text per `span.tok` inside `.chips`."""

    def __init__(self) -> None:
        super().__init__()
        self.chips: list[dict[str, str]] = []
        self.roles: list[str] = []
        self._in: dict[str, str] | None = None
        self._chips_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "div" and "chips" in a.get("class", "").split():
            self._chips_depth += 1
        if self._chips_depth and tag == "span":
            classes = a.get("class", "").split()
            if "tok" in classes:
                self._in = {**a, "text": ""}
                self.chips.append(self._in)
            elif "role-mark" in classes:
                self.roles.append(a.get("data-role", ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._in = None
        if tag == "div" and self._chips_depth:
            self._chips_depth -= 1

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            self._in["text"] += data


def chips_of(html: str) -> Chips:
    parser = Chips()
    parser.feed(html)
    return parser


# -- list, register, overview ------------------------------------------------------------------------


def test_register_list_and_overview(client: Any, chat: dict[str, Path]) -> None:
    ds_id = registered(client, chat["dataset"])
    rows = shard_rows(chat["dataset"])
    tokens = sum(len(r["input_ids"]) for r in rows)
    trained = sum(sum(r["loss_mask"]) for r in rows)

    page = client.get("/datasets")
    assert page.status_code == 200
    assert 'href="/datasets"' in page.text and "chat-tok" in page.text
    row_html = page.text[page.text.index(f'data-dataset="{ds_id}"') :]
    assert f">{len(rows)}<" in row_html and f"{tokens:,}" in row_html and f"{trained:,}" in row_html

    detail = client.get(f"/datasets/{ds_id}")
    assert detail.status_code == 200
    import json

    manifest = json.loads((chat["dataset"] / "manifest.json").read_text())
    for shard in manifest["shards"]:
        assert shard["filename"] in detail.text and shard["sha256"] in detail.text
        assert shard["filename"] in row_html and shard["sha256"][:12] in row_html  # the list unfolds them too
    assert f'id="fact-rows">{len(rows)}<' in detail.text
    train = re.search(r'href="([^"]+)">Train on this<', detail.text)  # the next step, prefilled
    assert (
        train and "kind=train" in train[1] and urllib.parse.quote(str(chat["dataset"]), safe="") in train[1]
    )
    assert f'id="fact-trained">{trained:,}<' in detail.text
    # registering the same folder again leads to the same dataset, by the path the list shows too
    assert register(client, chat["dataset"]).headers["location"] == f"/datasets/{ds_id}"
    shown = re.search(r'<div class="path muted small" title="[^"]*">([^<]+)</div>', row_html)
    assert shown and not Path(shown[1]).is_absolute()  # short, and typed back it is the same folder
    assert register(client, html.unescape(shown[1])).headers["location"] == f"/datasets/{ds_id}"
    placeholder = re.search(r'placeholder="([^"]+)"', page.text)  # an example that leads somewhere real
    assert placeholder and "outside the data roots" not in register(client, placeholder[1]).text


def test_register_refuses_outside_roots_and_non_datasets(client: Any, migrated: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    r = register(client, outside)
    assert r.status_code == 400 and "outside the data roots" in r.text
    plain = migrated / "data" / "plain"
    plain.mkdir()
    r = register(client, plain)
    assert r.status_code == 400 and "no manifest.json or state.json" in r.text
    r = register(client, migrated / "data" / "missing")
    assert r.status_code == 400 and "no such file or directory" in r.text
    r = client.post("/datasets", data={"path": str(plain)})  # no CSRF token
    assert r.status_code == 403


def test_job_outputs_appear_in_the_list(client: Any, chat: dict[str, Path]) -> None:
    from app.store.dataset_records import add_datasets, found_in_outputs
    from app.store.db import session_scope
    from app.store.models import Job, JobOutput

    shards = sorted(chat["dataset"].glob("data-*.arrow"))
    assert len(shards) >= 2
    found = found_in_outputs(shards)  # before the success transaction: it reads the shards
    with session_scope() as s:  # what the success transaction writes beside the outputs
        job = Job(kind="tokenize", params={}, status="succeeded")
        s.add(job)
        s.flush()
        assert job.id is not None
        for f in shards:
            s.add(JobOutput(job_id=job.id, path=str(f), rows=1, bytes=f.stat().st_size, sha256="x"))
        add_datasets(s, found, job_id=job.id)
        s.commit()
        job_id = job.id
    page = client.get("/datasets")
    assert f'href="/jobs/{job_id}"' in page.text and "chat-tok" in page.text
    assert page.text.count('data-dataset="') == 1  # two shard outputs, one dataset


def test_get_writes_nothing_and_40_concurrent_lists_answer(client: Any, chat: dict[str, Path]) -> None:
    """A job output nobody registered stays out of the list: GET /datasets reads the table, inserts
    nothing (40 concurrent GETs used to race on the unique path and answer 500)."""
    from concurrent.futures import ThreadPoolExecutor

    from sqlmodel import func, select

    from app.store.db import session_scope
    from app.store.models import Alert, Dataset, Job, JobOutput

    with session_scope() as s:
        job = Job(kind="tokenize", params={}, status="succeeded")
        s.add(job)
        s.flush()
        assert job.id is not None
        for f in sorted(chat["dataset"].glob("data-*.arrow")):
            s.add(JobOutput(job_id=job.id, path=str(f), rows=1, bytes=f.stat().st_size, sha256="x"))
        s.commit()
    with ThreadPoolExecutor(max_workers=40) as pool:
        answers = list(pool.map(lambda _: client.get("/datasets").status_code, range(40)))
    assert answers == [200] * 40
    with session_scope() as s:
        assert s.exec(select(func.count()).select_from(Dataset)).one() == 0
        assert s.exec(select(func.count()).select_from(Alert)).one() == 0


# -- sample view -------------------------------------------------------------------------------------


def test_chips_match_the_row(client: Any, chat: dict[str, Path], tokenizer_dir: Path) -> None:
    ds_id = registered(client, chat["dataset"])
    rows = shard_rows(chat["dataset"])
    tok = load_tokenizer(tokenizer_dir)
    for n, row in enumerate(rows):
        page = client.get(f"/datasets/{ds_id}/rows/{n}")
        assert page.status_code == 200, page.text
        parsed = chips_of(page.text)
        chips = parsed.chips
        assert [int(c["data-id"]) for c in chips] == row["input_ids"]
        assert [int(c["data-m"]) for c in chips] == row["loss_mask"]
        trained = [c for c in chips if "tr" in c["class"].split()]
        assert len(trained) == sum(row["loss_mask"]) == row["n_trained"]
        assert f'id="fact-n-trained">{row["n_trained"]}' in page.text
        mask = row["loss_mask"]
        anchors = [c for c in chips if "anchor" in c["class"].split()]
        assert [int(c["data-p"]) for c in anchors] == [
            p for p in range(len(mask) - 1) if mask[p] and mask[p + 1]
        ]
        # the chips' text, put back together, is the decoded row (no replacement characters)
        text = "".join(c["data-t"] for c in chips if "cont" not in c["class"].split())
        assert text == tok.decode(row["input_ids"]) and "\ufffd" not in page.text
        assert "user" in parsed.roles
    # CJK and emoji split over byte tokens show as whole characters
    cjk = next(n for n, r in enumerate(rows) if "中" in tok.decode(r["input_ids"]))
    chips = chips_of(client.get(f"/datasets/{ds_id}/rows/{cjk}").text).chips
    texts = [c["text"] for c in chips]
    assert "中" in texts and "🙂" in texts and "🏽" in texts
    assert any("cont" in c["class"].split() for c in chips)
    special = [c for c in chips if "special" in c["class"].split()]
    assert special and special[0]["text"] == "<|im_start|>"
    # whitespace is visible
    ws = next(n for n, r in enumerate(rows) if "\t" in tok.decode(r["input_ids"]))
    shown = "".join(c["text"] for c in chips_of(client.get(f"/datasets/{ds_id}/rows/{ws}").text).chips)
    assert "→" in shown and "↵" in shown and "·" in shown


def test_hostile_text_is_escaped(client: Any, chat: dict[str, Path], tokenizer_dir: Path) -> None:
    ds_id = registered(client, chat["dataset"])
    tok = load_tokenizer(tokenizer_dir)
    rows = shard_rows(chat["dataset"])
    markers = ("<script>", "<img", "javascript:", "{{")
    hostile = [n for n, r in enumerate(rows) if any(m in tok.decode(r["input_ids"]) for m in markers)]
    assert len(hostile) >= 2
    for n in hostile:
        page = client.get(f"/datasets/{ds_id}/rows/{n}")
        assert page.status_code == 200
        body = page.text
        assert "<script>alert" not in body and "<img" not in body and 'href="javascript:' not in body
        assert "&lt;" in body or "{{" in body
        shown = "".join(c["text"] for c in chips_of(body).chips)
        if "{{" in tok.decode(rows[n]["input_ids"]):
            assert "{{·7*7·}}" in shown and "49" not in shown  # template syntax shown, never evaluated
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
        source = client.get(f"/datasets/{ds_id}/rows/{n}/source")
        assert source.status_code == 200 and "<script>alert" not in source.text and "<img" not in source.text
        assert "&lt;" in source.text and 'id="source-conversation"' in source.text


def test_out_of_range_and_bad_filters_say_why(client: Any, chat: dict[str, Path]) -> None:
    ds_id = registered(client, chat["dataset"])
    n = len(shard_rows(chat["dataset"]))
    r = client.get(f"/datasets/{ds_id}/rows/{n}")
    assert r.status_code == 404 and f"row {n} is out of range" in r.text and f"rows 0 to {n - 1}" in r.text
    r = client.get(f"/datasets/{ds_id}/rows/-1")
    assert r.status_code == 404 and "out of range" in r.text
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "row", "at": "abc"})
    assert r.status_code == 400 and "whole number" in r.text
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "row", "at": str(n + 5)}, follow_redirects=False)
    assert r.status_code == 400 and "out of range" in r.text
    for params, words in (
        ({"min_len": "abc"}, "min_len must be a whole number"),
        ({"min_frac": "2"}, "min_frac must be between 0 and 1"),
        ({"min_len": "50", "max_len": "10"}, "the length range is empty"),
        ({"truncated": "maybe"}, "truncated must be yes or no"),
        ({"turn": "-3"}, "turn must be 0 or more"),
    ):
        r = client.get(f"/datasets/{ds_id}/rows/0", params=params)
        assert r.status_code == 400 and words in r.text, (params, r.text[:200])
        r = client.get(f"/datasets/{ds_id}/go", params={**params, "to": "next", "at": "0"})
        assert r.status_code == 400 and words in r.text
    assert client.get("/datasets/999/rows/0").status_code == 404
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "sideways", "at": "0"})
    assert r.status_code == 400 and "unknown navigation" in r.text


def test_the_row_view_counts_rows_as_people_do_beside_the_index(client: Any, chat: dict[str, Path]) -> None:
    """It read "Row 0 of 0-1" (an en dash): the row's place counts from 1 ("Row 1 of 2"), its index
    (ds[i], the address) is said apart."""
    ds_id = registered(client, chat["dataset"])
    n = len(shard_rows(chat["dataset"]))
    for index in (0, n - 1):
        pos = (
            client.get(f"/datasets/{ds_id}/rows/{index}")
            .text.split('id="row-pos"', 1)[1]
            .split("</span>\n")[0]
        )
        said = " ".join(re.sub(r"<[^>]+>", "", pos.split(">", 1)[1]).split())
        assert said.startswith(f"Row {index + 1:,} of {n:,} (index {index:,})"), said
        assert "of 0\N{EN DASH}" not in pos


def test_filters_and_navigation(client: Any, chat: dict[str, Path]) -> None:
    ds_id = registered(client, chat["dataset"])
    rows = shard_rows(chat["dataset"])
    truncated = [n for n, r in enumerate(rows) if r["truncated"]]
    assert truncated and len(truncated) < len(rows)
    # next/prev without filters
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "next", "at": "0"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/datasets/{ds_id}/rows/1"
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "prev", "at": "0"})
    assert "this is the first row" in r.text
    # htmx: a partial and a pushed, shareable URL
    r = client.get(
        f"/datasets/{ds_id}/go", params={"to": "first", "truncated": "1"}, headers={"HX-Request": "true"}
    )
    assert r.status_code == 200 and r.text.lstrip().startswith('<section id="sample"')
    assert r.headers["HX-Push-Url"] == f"/datasets/{ds_id}/rows/{truncated[0]}?truncated=1"
    seen = [truncated[0]]
    while True:
        r = client.get(f"/datasets/{ds_id}/go", params={"to": "next", "at": seen[-1], "truncated": "1"},
                       headers={"HX-Request": "true"})  # fmt: skip
        if "HX-Push-Url" not in r.headers:
            assert "no row matches" in r.text or "this is the last row that matches" in r.text
            break
        seen.append(int(r.headers["HX-Push-Url"].split("/rows/")[1].split("?")[0]))
        assert seen[-1] > seen[-2]
    assert seen == truncated
    page = client.get(f"/datasets/{ds_id}/rows/{truncated[0]}", params={"truncated": "1"})
    assert f"match 1 of {len(truncated)}" in page.text
    # length and trained-fraction ranges
    lengths = [len(r["input_ids"]) for r in rows]
    lo = sorted(lengths)[len(lengths) // 2]
    want = [n for n, x in enumerate(lengths) if x >= lo]
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "first", "min_len": lo}, follow_redirects=False)
    assert r.headers["location"] == f"/datasets/{ds_id}/rows/{want[0]}?min_len={lo}"
    fracs = [sum(r["loss_mask"]) / len(r["loss_mask"]) for r in rows]
    want = [n for n, x in enumerate(fracs) if 0.4 <= x <= 0.6]
    for _ in range(10):
        r = client.get(f"/datasets/{ds_id}/go", params={"to": "random", "min_frac": "0.4", "max_frac": "0.6"},
                       follow_redirects=False)  # fmt: skip
        if want:
            assert int(r.headers["location"].split("/rows/")[1].split("?")[0]) in want
        else:
            assert "no row matches" in r.text
    # turn and source
    turn1 = [n for n, r in enumerate(rows) if r["turn"] == 1]
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "first", "turn": "1"}, follow_redirects=False)
    assert r.headers["location"].startswith(f"/datasets/{ds_id}/rows/{turn1[0]}?")
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "first", "source": "nope.jsonl"})
    assert "no row matches these filters" in r.text
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "first", "source": str(chat["source"])},
                   follow_redirects=False)  # fmt: skip
    assert r.status_code == 303


def test_text_search(client: Any, chat: dict[str, Path], tokenizer_dir: Path,
                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from draftdeck.browse import filters

    ds_id = registered(client, chat["dataset"])
    tok = load_tokenizer(tokenizer_dir)
    texts = [tok.decode(r["input_ids"]) for r in shard_rows(chat["dataset"])]
    want = [n for n, t in enumerate(texts) if "qubits" in t.casefold()]
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "first", "q": "QUBITS"}, follow_redirects=False)
    assert r.headers["location"] == f"/datasets/{ds_id}/rows/{want[0]}?q=QUBITS"
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "next", "at": want[0], "q": "qubits"},
                   follow_redirects=False)  # fmt: skip
    if len(want) > 1:
        assert r.headers["location"].startswith(f"/datasets/{ds_id}/rows/{want[1]}?")
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "first", "q": "no such words anywhere"})
    assert "no row contains" in r.text
    # a search that runs out of budget says how far it looked and offers to continue
    monkeypatch.setattr(filters, "SEARCH_BUDGET_ROWS", 1)
    monkeypatch.setattr(filters, "SEARCH_BATCH", 1)
    r = client.get(f"/datasets/{ds_id}/go", params={"to": "first", "q": "qubits"})
    assert "not found in the 1 row searched" in r.text and 'id="resume-search"' in r.text
    resume = re.search(r'id="resume-search"', r.text)
    assert resume is not None
    at = 1
    while True:
        r = client.get(f"/datasets/{ds_id}/go", params={"to": "resume", "at": at, "q": "qubits"},
                       follow_redirects=False)  # fmt: skip
        if r.status_code == 303:
            assert r.headers["location"].startswith(f"/datasets/{ds_id}/rows/{want[0]}?")
            break
        at += 1
        assert at <= want[0]


def test_source_conversation(client: Any, chat: dict[str, Path], migrated: Path) -> None:
    ds_id = registered(client, chat["dataset"])
    r = client.get(f"/datasets/{ds_id}/rows/0/source")
    assert r.status_code == 200 and "hello user, this is a test." in r.text and "chats.jsonl:1" in r.text
    # a source file outside the data roots is not read
    outside_tok = chat["tokenizer"]
    rows = [{**encode_chat(load_tokenizer(outside_tok), [{"role": "assistant", "content": "hi"}]),
             "source": "/etc/passwd", "source_row": 0}]  # fmt: skip
    other = write_dataset(migrated / "datasets" / "other", rows, outside_tok)
    other_id = registered(client, other)
    r = client.get(f"/datasets/{other_id}/rows/0/source")
    assert "outside the data roots" in r.text and "root:" not in r.text


def test_tokenizer_missing_shows_ids(client: Any, migrated: Path) -> None:
    rows = [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "source": "s", "source_row": 0}]
    ds = write_dataset(migrated / "datasets" / "notok", rows, migrated / "no-such-tokenizer")
    ds_id = registered(client, ds)
    r = client.get(f"/datasets/{ds_id}/rows/0")
    assert r.status_code == 200 and "is not on this machine: showing token ids" in r.text
    chips = chips_of(r.text).chips
    assert [c["text"] for c in chips] == ["5", "6", "7"]
    assert len([c for c in chips if "tr" in c["class"].split()]) == 2


# -- statistics, alerts, compare, delete -------------------------------------------------------------


def test_statistics_match_the_shards(client: Any, chat: dict[str, Path]) -> None:
    ds_id = registered(client, chat["dataset"])
    rows = shard_rows(chat["dataset"])
    lengths = np.array([len(r["input_ids"]) for r in rows])
    trained = np.array([sum(r["loss_mask"]) for r in rows])
    data = client.get(f"/datasets/{ds_id}/stats.json").json()
    assert data["rows"] == len(rows) and data["tokens"] == lengths.sum() and data["trained"] == trained.sum()
    h = data["length"]
    assert len(h["edges"]) == len(h["counts"]) + 1
    direct = [
        int(((lengths >= a) & (lengths < b)).sum()) for a, b in zip(h["edges"], h["edges"][1:], strict=False)
    ]
    assert h["counts"] == direct and sum(direct) == len(rows)
    f = data["trained_fraction"]
    frac = trained / lengths
    bins = np.minimum((frac * 10).astype(int), 9)
    assert f["counts"] == [int((bins == i).sum()) for i in range(10)]
    by_source: dict[str, list[int]] = {}
    for r in rows:
        e = by_source.setdefault(r["source"], [0, 0, 0])
        e[0] += 1
        e[1] += len(r["input_ids"])
        e[2] += sum(r["loss_mask"])
    assert {s["source"]: [s["rows"], s["tokens"], s["trained"]] for s in data["per_source"]} == by_source
    page = client.get(f"/datasets/{ds_id}/stats")
    assert page.status_code == 200
    assert 'data-stats="/datasets/' in page.text and "<script>" not in page.text.split("</head>")[1]
    assert f'id="stat-rows">{len(rows)}<' in page.text


def test_alerts_raised_once_and_acknowledged(client: Any, migrated: Path, tokenizer_dir: Path) -> None:
    from sqlmodel import select

    from app.store.db import session_scope
    from app.store.models import Alert

    empty = write_dataset(migrated / "datasets" / "empty", [], tokenizer_dir)
    ds_id = registered(client, empty)
    page = client.get(f"/datasets/{ds_id}")
    assert 'data-kind="empty_output"' in page.text and "has no rows" in page.text
    client.get(f"/datasets/{ds_id}")
    with session_scope() as s:
        alerts = s.exec(select(Alert).where(Alert.dataset == str(empty.resolve()))).all()
    assert [a.kind for a in alerts] == ["empty_output"]
    ack = f"/datasets/{ds_id}/alerts/{alerts[0].id}/ack"
    r = client.post(ack, data={"csrf": form_token(client)}, follow_redirects=False)
    assert r.status_code == 303
    page = client.get(f"/datasets/{ds_id}")
    assert "acknowledged" in page.text and "Acknowledge</button>" not in page.text
    r = client.post(f"/datasets/{ds_id}/alerts/99999/ack", data={"csrf": form_token(client)})
    assert r.status_code == 404
    # rows with no trained token and heavy truncation
    rows = [{"input_ids": [1, 2, 3], "loss_mask": [0, 0, 0], "truncated": True},
            {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "truncated": True}]  # fmt: skip
    bad = write_dataset(migrated / "datasets" / "bad", rows, tokenizer_dir, shard_rows=1)
    bad_id = registered(client, bad)
    page = client.get(f"/datasets/{bad_id}").text
    assert "1 of 2 rows have no trained token" in page and 'data-kind="high_truncation"' in page
    listing = client.get("/datasets").text
    assert 'class="badge badge-alert">2<' in listing[listing.index(f'data-dataset="{bad_id}"') :]
    # a zero-byte shard: alerted, and the pages still answer
    broken = write_dataset(migrated / "datasets" / "broken", rows, tokenizer_dir, shard_rows=1)
    (broken / "data-00001-of-00002.arrow").write_bytes(b"")
    broken_id = registered(client, broken)
    page = client.get(f"/datasets/{broken_id}")
    assert page.status_code == 200 and 'data-kind="zero_byte_shard"' in page.text
    assert 'data-kind="unreadable_shard"' in page.text
    assert client.get(f"/datasets/{broken_id}/rows/0").status_code == 200
    r = client.get(f"/datasets/{broken_id}/rows/1")
    assert r.status_code in (404, 409) and "cannot be read" in r.text
    r = client.get(f"/datasets/{broken_id}/go", params={"to": "first", "truncated": "1"})
    assert "cannot be read" in r.text


def test_compare(client: Any, chat: dict[str, Path], migrated: Path, tokenizer_dir: Path) -> None:
    a = registered(client, chat["dataset"])
    small = write_dataset(migrated / "datasets" / "small",
                          [{"input_ids": [1, 70, 2], "loss_mask": [0, 1, 1]}], tokenizer_dir)  # fmt: skip
    b = registered(client, small)
    r = client.get("/datasets/compare", params={"a": a, "b": b})
    assert r.status_code == 200 and 'id="side-1"' in r.text and 'id="side-2"' in r.text
    r = client.get("/datasets/compare", params={"a": a, "b": b, "row": 0})
    # b holds no row of a's conversation: nothing to pair it with, and the page says which row it sought
    assert r.text.count('class="chips"') == 1 and "no row of this dataset comes from chats.jsonl:1" in r.text
    r = client.get("/datasets/compare", params={"a": b, "b": a, "row": 3})
    assert r.text.count('class="chips"') == 0 and "row 3 is out of range" in r.text
    r = client.get("/datasets/compare", params={"a": a, "b": b, "row": "x"})
    assert r.status_code == 400 and "whole number" in r.text
    # the same row under another mask: the differing positions are counted and outlined
    other = write_dataset(migrated / "datasets" / "small-b",
                          [{"input_ids": [1, 70, 2], "loss_mask": [0, 0, 1]}], tokenizer_dir)  # fmt: skip
    c = registered(client, other)
    r = client.get("/datasets/compare", params={"a": b, "b": c, "row": 0})
    assert (
        "Same token ids (3 tokens)" in r.text and "differ at 1 position " in r.text and "first at 1" in r.text
    )
    assert [x["data-p"] for x in chips_of(r.text).chips if "diff" in x["class"].split()] == ["1", "1"]


def test_compare_pairs_rows_by_source_and_stops_at_the_first_other_id(
    client: Any, chat: dict[str, Path], migrated: Path, tokenizer_dir: Path
) -> None:
    """Another tokenization of the same conversations, in another order and with one row whose ids
    diverge: each row is paired with the row of the same (source, source row, turn), not the same
    index, and masks past the first differing id are not counted as differences."""
    rows = shard_rows(chat["dataset"])
    assert len(rows) >= 3 and len({(r["source_row"], r["turn"]) for r in rows}) == len(rows)
    other = [dict(r) for r in reversed(rows)]
    changed = other[0]  # the last row of a, now first: ids diverge at 2, every mask after it flipped
    changed["input_ids"] = [*changed["input_ids"][:2], 7, *changed["input_ids"][3:]]
    changed["loss_mask"] = changed["loss_mask"][:3] + [1 - m for m in changed["loss_mask"][3:]]
    moved = write_dataset(migrated / "datasets" / "chat-reordered", other, tokenizer_dir)
    a, b = registered(client, chat["dataset"]), registered(client, moved)
    last = len(rows) - 1
    r = client.get("/datasets/compare", params={"a": a, "b": b, "row": 0})
    assert r.status_code == 200, r.text
    assert (
        f"row {last} here comes from chats.jsonl:{rows[0]['source_row']}, assistant turn {rows[0]['turn']}"
        in r.text
    )
    assert "Same token ids" in r.text and "Loss masks agree." in r.text
    r = client.get("/datasets/compare", params={"a": a, "b": b, "row": last})
    assert "row 0 here comes from" in r.text and "Token ids differ from position 2" in r.text
    assert "masks are not compared" in r.text and not chips_of(r.text).chips[0].get("class", "").count("diff")
    assert not [x for x in chips_of(r.text).chips if "diff" in x["class"].split()]


def test_delete_needs_confirmation_and_stays_inside_roots(client: Any, chat: dict[str, Path],
                                                          tmp_path: Path) -> None:  # fmt: skip
    from app.store.db import session_scope
    from app.store.models import Dataset

    csrf = form_token(client)
    ds_id = registered(client, chat["dataset"])
    assert "Type the name" in client.get(f"/datasets/{ds_id}/delete").text
    r = client.post(f"/datasets/{ds_id}/delete", data={"csrf": csrf, "confirm": "wrong", "files": "1"})
    assert r.status_code == 400 and chat["dataset"].is_dir()
    r = client.post(f"/datasets/{ds_id}/delete", data={"csrf": csrf, "confirm": "chat-tok", "files": "1"},
                    follow_redirects=False)  # fmt: skip
    assert r.status_code == 303 and not chat["dataset"].exists()
    assert client.get(f"/datasets/{ds_id}").status_code == 404
    # a dataset recorded outside the roots: forgotten on request, its files never touched
    outside = tmp_path / "outside-ds"
    shutil.copytree(chat["tokenizer"], outside)
    with session_scope() as s:
        row = Dataset(path=str(outside), name="outside-ds")
        s.add(row)
        s.commit()
        s.refresh(row)
        out_id = row.id
    page = client.get(f"/datasets/{out_id}/delete").text
    assert "Its files stay on disk" in page and "outside the data roots" in page
    r = client.post(f"/datasets/{out_id}/delete", data={"csrf": csrf, "confirm": "outside-ds", "files": "1"})
    assert r.status_code == 400 and "the files were not deleted" in r.text and outside.is_dir()
    r = client.post(f"/datasets/{out_id}/delete", data={"csrf": csrf, "confirm": "outside-ds"},
                    follow_redirects=False)  # fmt: skip
    assert r.status_code == 303 and outside.is_dir()
    # a data root itself (or a folder holding one), or a folder that is not a dataset: never deleted
    home = chat["source"].parents[1]  # the DraftDeck home, a data root
    plain = home / "data" / "plain-folder"
    plain.mkdir()
    for path, name, why in ((home, home.name, "data root"), (plain, "plain-folder", "no longer looks like")):
        with session_scope() as s:
            row = Dataset(path=str(path), name=name)
            s.add(row)
            s.commit()
            s.refresh(row)
        r = client.post(f"/datasets/{row.id}/delete", data={"csrf": csrf, "confirm": name, "files": "1"})
        assert r.status_code == 400 and why in r.text and path.is_dir()


def test_migration_up_down_sqlite_and_postgres_sql(
    migrated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from alembic import command
    from sqlalchemy import inspect

    from app.store.db import alembic_config, get_engine

    cfg = alembic_config()
    assert "datasets" in inspect(get_engine()).get_table_names()
    command.downgrade(cfg, "0001")
    assert "datasets" not in inspect(get_engine()).get_table_names()
    command.upgrade(cfg, "head")
    assert "datasets" in inspect(get_engine()).get_table_names()
    pg = alembic_config("postgresql+psycopg://u@localhost/x")
    command.upgrade(pg, "0001:0002", sql=True)
    sql = capsys.readouterr().out
    assert "CREATE TABLE datasets" in sql and "CONSTRAINT uq_datasets_path UNIQUE (path)" in sql
    assert "CREATE INDEX ix_datasets_job_id" in sql


def test_a_real_tokenize_job_is_browsable(client: Any, migrated: Path) -> None:
    """End to end with the project's own pipeline: a tokenize job's shards appear in the list under the
    job, every row's chips match its shard row, and the source panel finds each row's conversation."""
    import json

    from sqlmodel import select

    from app.store import records as jobs
    from app.store.dataset_records import add_datasets, found_in_outputs
    from app.store.db import session_scope
    from app.store.models import JobOutput
    from draftdeck.chat.testing import small_bpe_tokenizer
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
    from tests.support.datasets import sample_conversations

    data = migrated / "data"
    src = data / "chats.jsonl"
    src.write_text(
        "".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in sample_conversations())
    )
    tok = data / "tok"
    shutil.copytree(small_bpe_tokenizer(), tok)
    out_dir = migrated / "jobs" / "tok-out"
    report = tokenize_files([src], out_dir, TokenizeOptions(tok, shard_rows=3, workers=1))
    found = found_in_outputs(o.path for o in report.outputs)
    with session_scope() as session:  # what the worker records when the job succeeds
        job = jobs.create_job(session, "tokenize", {"inputs": [str(src)], "tokenizer": str(tok)}, "cpu")
        jobs.record_outputs(session, job.id or 0, report.outputs)
        add_datasets(session, found, job_id=job.id)
        session.commit()
        outputs = list(session.exec(select(JobOutput).where(JobOutput.job_id == job.id)))
    assert len(outputs) >= 2
    ds_dir = Path(outputs[0].path).parent
    listing = client.get("/datasets").text
    assert f'href="/jobs/{job.id}"' in listing and ds_dir.name in listing
    ds_id = int(re.search(r'data-dataset="(\d+)"', listing).group(1))  # type: ignore[union-attr]
    rows = shard_rows(ds_dir)
    assert rows
    for n, row in enumerate(rows):
        page = client.get(f"/datasets/{ds_id}/rows/{n}")
        chips = chips_of(page.text).chips
        assert [int(c["data-id"]) for c in chips] == row["input_ids"]
        assert len([c for c in chips if "tr" in c["class"].split()]) == row["n_trained"] > 0
        assert "<script>alert" not in page.text and "\ufffd" not in page.text
        source = client.get(f"/datasets/{ds_id}/rows/{n}/source").text
        assert 'id="source-conversation"' in source and f"chats.jsonl:{row['source_row']}" in source
        # the row's facts use the panel's notation (JSONL lines count from 1), and say what turn -1 means
        facts = page.text.split('id="fact-turn"', 1)[1]
        assert f">chats.jsonl:{row['source_row']}</dd>" in facts
        assert ">every assistant turn</dd>" in facts or f">assistant turn {row['turn']} only</dd>" in facts
    assert client.get(f"/datasets/{ds_id}").status_code == 200
    assert client.get(f"/datasets/{ds_id}/stats.json").json()["rows"] == len(rows)


def test_the_source_panel_opens_the_original_row_of_a_converted_file(client: Any, migrated: Path) -> None:
    """Converted (JSON array -> OpenAI JSONL) then tokenized: the panel shows the row of the original
    file, and the statistics count the original file as the source."""
    import json

    from draftdeck.chat.testing import small_bpe_tokenizer
    from draftdeck.convert import convert
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
    from tests.support.datasets import sample_conversations

    data = migrated / "data"
    original = data / "original.json"  # a JSON array: rows are 0-based records
    original.write_text(json.dumps([{"messages": c} for c in sample_conversations()]))
    converted = data / "converted.jsonl"
    convert([original], converted, "openai")
    tok = data / "tok"
    shutil.copytree(small_bpe_tokenizer(), tok)
    out_dir = migrated / "datasets" / "from-converted"
    tokenize_files([converted], out_dir, TokenizeOptions(tok, workers=1))
    ds_id = registered(client, out_dir)
    rows = shard_rows(out_dir)
    assert rows and {r["source"] for r in rows} == {str(original)}
    for n, row in enumerate(rows):
        source = client.get(f"/datasets/{ds_id}/rows/{n}/source").text
        assert 'id="source-conversation"' in source and f"original.json[{row['source_row']}]" in source
        facts = client.get(f"/datasets/{ds_id}/rows/{n}").text.split('id="fact-source"', 1)[1]
        assert facts.split(">", 1)[1].startswith(f"original.json[{row['source_row']}]</dd>")
    per_source = client.get(f"/datasets/{ds_id}/stats.json").json()["per_source"]
    assert [s["source"] for s in per_source] == [str(original)]


def test_the_source_panel_reads_a_parquet_source(client: Any, migrated: Path) -> None:
    """A table's rows are records counted from 0, read with the table reader (the panel read every
    source as JSON text, and said a Parquet file could not be read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftdeck.chat.testing import small_bpe_tokenizer
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
    from tests.support.datasets import sample_conversations

    data = migrated / "data"
    table = data / "chats.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": c} for c in sample_conversations()]), table)
    tok = data / "tok"
    shutil.copytree(small_bpe_tokenizer(), tok)
    out_dir = migrated / "datasets" / "from-parquet"
    tokenize_files([table], out_dir, TokenizeOptions(tok, workers=1))
    ds_id = registered(client, out_dir)
    row = shard_rows(out_dir)[-1]
    source = client.get(f"/datasets/{ds_id}/rows/{len(shard_rows(out_dir)) - 1}/source").text
    assert 'id="source-conversation"' in source and f"chats.parquet[{row['source_row']}]" in source


@pytest.mark.services
def test_pages_and_migration_on_postgresql(dd_home: Path, tokenizer_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The same routes on PostgreSQL (skipped when no server answers at DRAFTDECK_TEST_PG)."""
    import os
    import uuid

    psycopg = pytest.importorskip("psycopg")
    admin = os.environ.get("DRAFTDECK_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    try:
        psycopg.connect(admin, connect_timeout=3).close()
    except Exception as exc:
        pytest.skip(f"no PostgreSQL at {admin}: {exc}")
    name = f"draftdeck_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        from alembic import command
        from fastapi.testclient import TestClient
        from sqlalchemy import inspect

        from app.settings import get_settings
        from app.store.db import alembic_config, get_engine, upgrade
        from app.web.main import create_app

        monkeypatch.setenv(
            "DATABASE_URL", f"postgresql://{admin.split('://', 1)[1].rsplit('/', 1)[0]}/{name}"
        )
        get_settings.cache_clear()
        get_engine.cache_clear()
        upgrade()
        made = build_chat_dataset(dd_home, tokenizer_dir=tokenizer_dir)
        empty = write_dataset(dd_home / "datasets" / "empty", [], tokenizer_dir)
        with TestClient(create_app()) as c:
            c.get("/datasets")
            ds_id = registered(c, made["dataset"])
            empty_id = registered(c, empty)
            assert registered(c, made["dataset"]) == ds_id
            assert c.get(f"/datasets/{ds_id}/rows/1").status_code == 200
            assert 'data-kind="empty_output"' in c.get(f"/datasets/{empty_id}").text
            form = {"csrf": form_token(c), "confirm": "empty"}
            r = c.post(f"/datasets/{empty_id}/delete", data=form, follow_redirects=False)
            assert r.status_code == 303 and empty.is_dir()
        get_engine().dispose()
        cfg = alembic_config()
        command.downgrade(cfg, "0001")
        assert "datasets" not in inspect(get_engine()).get_table_names()
        command.upgrade(cfg, "head")
        assert "datasets" in inspect(get_engine()).get_table_names()
        get_engine().dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_long_rows_are_drawn_in_windows(client: Any, migrated: Path, tokenizer_dir: Path) -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 300, 5000).tolist()
    mask = [0] * 1000 + [1] * 4000
    ds = write_dataset(migrated / "datasets" / "long", [{"input_ids": ids, "loss_mask": mask}], tokenizer_dir)
    ds_id = registered(client, ds)
    first = client.get(f"/datasets/{ds_id}/rows/0")
    chips = chips_of(first.text).chips
    assert (
        len(chips) == 4096
        and chips[0]["data-p"] == "0"
        and "Showing tokens 0&ndash;4,095 of 5,000" in first.text
    )
    assert 'id="fact-n-tokens">5,000<' in first.text and 'id="fact-n-trained">4,000' in first.text
    link = re.search(r'id="window-next"', first.text) and re.search(r'href="([^"]*tokens=4096)"', first.text)
    assert link
    second = client.get(link.group(1).replace("&amp;", "&"))
    rest = chips_of(second.text).chips
    assert [int(c["data-p"]) for c in rest] == list(range(4096, 5000))
    trained = [c for c in chips + rest if "tr" in c["class"].split()]
    assert len(trained) == 4000 and 'id="window-prev"' in second.text


def _badges(page: str) -> list[str]:
    found = re.search(r'<dd id="row-issues">(.*?)</dd>', page, re.S)
    return (
        re.findall(r'class="sev sev-warning issue-badge" title="[^"]+">([a-z_]+)</span>', found.group(1))
        if found
        else []
    )


def test_row_issue_badges_new_and_old_shards(client: Any, migrated: Path) -> None:
    """A kept row's warning codes (convert's checks, truncation) are stored per row by tokenize and
    shown as badges on its sample; shards written before the `issues` column still show truncation."""
    import json

    from draftdeck.chat.testing import small_bpe_tokenizer
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files

    data = migrated / "data"
    src = data / "warned.jsonl"
    convs = [
        [{"role": "user", "content": "q1"}, {"role": "user", "content": "again"},
         {"role": "assistant", "content": "a fine answer"}],  # non_alternating: a warning, kept
        [{"role": "user", "content": "write"}, {"role": "assistant", "content": " ".join(["word"] * 300)}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
    ]  # fmt: skip
    src.write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs))
    tok = data / "tok"
    shutil.copytree(small_bpe_tokenizer(), tok)
    out_dir = data / "warned-ds"
    tokenize_files([src], out_dir, TokenizeOptions(tok, workers=1, seq_length=64, max_rejected=None))
    rows = shard_rows(out_dir)  # in the shards' order, each naming its line
    want = {1: ["non_alternating"], 2: ["truncated"], 3: []}
    assert {r["source_row"]: r["issues"] for r in rows} == want
    ds_id = registered(client, out_dir)
    pages = {r["source_row"]: client.get(f"/datasets/{ds_id}/rows/{n}").text for n, r in enumerate(rows)}
    assert {line: _badges(p) for line, p in pages.items()} == want
    assert 'title="user and assistant turns do not alternate"' in pages[1]
    assert 'id="row-issues"' not in pages[3]
    # shards of before the column (a copy rewritten without it) still read, truncation still shown
    old_dir = data / "warned-old"
    shutil.copytree(out_dir, old_dir)
    for f in old_dir.glob("data-*.arrow"):
        table = (
            pa.ipc.open_stream(f.read_bytes()).read_all().drop_columns(["issues"])
        )  # not mapped: rewritten
        with pa.OSFile(str(f), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    old_id = registered(client, old_dir)
    old = {
        r["source_row"]: _badges(client.get(f"/datasets/{old_id}/rows/{n}").text) for n, r in enumerate(rows)
    }
    assert old == {1: [], 2: ["truncated"], 3: []}


def test_answers_untrained_by_a_flag_are_counted_and_badged(client: Any, migrated: Path) -> None:
    """A weight-0 answer is context, not loss: the dataset page counts such answers apart from the
    trained ones, and the row's sample carries the untrained_answer badge."""
    import json

    from draftdeck.chat.testing import small_bpe_tokenizer
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files

    data = migrated / "data"
    src = data / "flagged.jsonl"
    wrong = {"role": "assistant", "content": "wrong", "weight": 0}
    right = {"role": "assistant", "content": "right", "weight": 1}
    rows = [
        {"messages": [{"role": "user", "content": "q"}, wrong, {"role": "user", "content": "again"}, right]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = data / "tok"
    shutil.copytree(small_bpe_tokenizer(), tok)
    out_dir = data / "flagged-ds"
    report = tokenize_files([src], out_dir, TokenizeOptions(tok, workers=1))
    assert dict(report.counts) == {"answers_trained": 2, "answers_untrained_by_flag": 1}
    ds_id = registered(client, out_dir)
    page = client.get(f"/datasets/{ds_id}").text
    untrained = page.split('id="answers-untrained"')[1].split("</div>")[0]
    assert '<span class="num">1</span>' in untrained and "answers untrained by a flag" in untrained
    assert "<code>untrained_answer</code>" in page  # the report's warning table names the rows
    by_line = {r["source_row"]: n for n, r in enumerate(shard_rows(out_dir))}
    assert _badges(client.get(f"/datasets/{ds_id}/rows/{by_line[1]}").text) == ["untrained_answer"]
    assert _badges(client.get(f"/datasets/{ds_id}/rows/{by_line[2]}").text) == []


def test_which_rows_kept_the_targets_own_ids_is_counted_and_noted(client: Any, migrated: Path) -> None:
    """Rows whose answers came with the target's token ids: the dataset page counts each path, a row's
    sample says its answer tokens are the target's own (a note, not a warning badge)."""
    import json

    from draftdeck.chat.render import load_tokenizer
    from draftdeck.chat.testing import small_bpe_tokenizer
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files

    data = migrated / "data"
    tok = data / "tok"
    shutil.copytree(small_bpe_tokenizer(), tok)
    t = load_tokenizer(tok)
    ids = [*t.encode("hello there", add_special_tokens=False), t.convert_tokens_to_ids("<|im_end|>")]
    rows = [
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": c, "token_ids": ids},
            ]
        }
        for c in ("hello there", "hello there, edited")
    ]
    src = data / "regen.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenize_files([src], data / "ids-ds", TokenizeOptions(tok, workers=1))
    ds_id = registered(client, data / "ids-ds")
    page = client.get(f"/datasets/{ds_id}").text
    for box in ("ids-from-target", "ids-reencoded"):
        assert '<span class="num">1</span>' in page.split(f'id="{box}"')[1].split("</div>")[0]
    by_line = {r["source_row"]: n for n, r in enumerate(shard_rows(data / "ids-ds"))}
    kept, edited = (client.get(f"/datasets/{ds_id}/rows/{by_line[n]}").text for n in (1, 2))
    assert "the target&#39;s own ids, as it generated them" in kept and _badges(kept) == []
    assert 'id="note-ids_from_target"' not in edited and _badges(edited) == ["ids_reencoded"]


def _made_by_a_tokenize_job(session: Any, source: Path, made: Path) -> tuple[Any, Any]:
    """A copy of the dataset `source` at `made`, recorded as made by a succeeded tokenize job:
    (the job, the dataset record)."""
    from app.store.dataset_records import add_datasets, found_at
    from app.store.models import Job

    shutil.copytree(source, made)
    job = Job(kind="tokenize", params={}, status="succeeded", queue="cpu")
    session.add(job)
    session.commit()
    [ds] = add_datasets(session, [found_at(made.resolve())], job_id=job.id)
    return job, ds


def test_a_dataset_shows_the_open_alerts_of_the_job_that_made_it(
    client: Any, chat: dict[str, Path], migrated: Path
) -> None:
    """/datasets said "Alerts: none" for a dataset whose tokenize job had an open alert: the list and
    the dataset's page show the alerts of the job that made it."""
    from sqlmodel import select

    from app.store.db import session_scope
    from app.store.models import Alert

    with session_scope() as s:
        job, ds = _made_by_a_tokenize_job(s, chat["dataset"], migrated / "datasets" / "made-by-job")
        s.commit()
        own = len(s.exec(select(Alert).where(Alert.dataset == ds.path)).all())  # what the shards raise
        s.add(Alert(job_id=job.id, kind="high_duplicated", message="219 of 1,000 rows are duplicates"))
        s.commit()
        ds_id = ds.id
    listing = client.get("/datasets").text
    row = listing[listing.index(f'data-dataset="{ds_id}"') :].split("\n  </tr>", 1)[0]
    assert f'class="badge badge-alert">{own + 1}<' in row
    page = client.get(f"/datasets/{ds_id}").text
    assert 'data-kind="high_duplicated"' in page and "219 of 1,000 rows are duplicates" in page


def test_alerts_page_links_each_dataset_alert_to_its_dataset(
    client: Any, chat: dict[str, Path], migrated: Path
) -> None:
    """/alerts showed a tokenize job's high_truncation with its job's button alone: an alert of a
    dataset (named by it, or raised by the job that made it) links to the dataset's page too."""
    from app.store.db import session_scope
    from app.store.models import Alert

    with session_scope() as s:
        job, ds = _made_by_a_tokenize_job(s, chat["dataset"], migrated / "datasets" / "cut-by-job")
        cut = Alert(job_id=job.id, kind="high_truncation", message=f"job {job.id}: 3 of 10 rows truncated")
        named = Alert(dataset=ds.path, kind="no_trained_tokens", message="1 of 10 rows have no trained token")
        alone = Alert(kind="worker_lost", message="a worker stopped answering")
        s.add_all([cut, named, alone])
        s.commit()
        ds_id, ids = ds.id, {a.kind: a.id for a in (cut, named, alone)}
    page = client.get("/alerts").text

    def item(kind: str) -> str:
        return page.split(f'data-alert="{ids[kind]}"', 1)[1].split("</li>", 1)[0]

    for kind in ("high_truncation", "no_trained_tokens"):
        assert f'href="/datasets/{ds_id}" data-alert-dataset="{ds_id}"' in item(kind), kind
    assert "cut-by-job" in item("high_truncation") and 'data-kind="high_truncation"' in page
    assert "/datasets/" not in item("worker_lost")


def test_a_dataset_tokenized_in_a_terminal_is_offered_for_registration(
    client: Any, migrated: Path, tokenizer_dir: Path
) -> None:
    """A folder made by `draftdeck tokenize` under a data root shows on /datasets with a Register
    button (it was invisible until registered by hand); once registered it leaves that list."""
    folder = write_dataset(migrated / "data" / "nested" / "from-cli",
                           [{"input_ids": [1, 70, 2], "loss_mask": [0, 1, 1]}], tokenizer_dir)  # fmt: skip
    page = client.get("/datasets").text
    offered = page.split('id="unregistered"', 1)[1].split("</section>", 1)[0]
    assert f'name="path" value="{folder.resolve()}"' in offered
    registered(client, folder)
    assert 'id="unregistered"' not in client.get("/datasets").text
