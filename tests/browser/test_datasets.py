"""Dataset pages in Debian's Chromium against a real `draftdeck web` (its own home and data roots):
paging, filters, search, token hover, the DFlash anchor toggle, trained chips = n_trained, hostile sample
text that must never execute, statistics against a direct count over the shards, and an empty-output
alert acknowledged from the dataset page."""

from __future__ import annotations

import os
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.browser.harness import CHROMIUM
from tests.support.datasets import build_chat_dataset, load_tokenizer, web_server, write_dataset
from tests.support.web import token_in

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent (apt-get install chromium)"
    ),
]


@dataclass
class Site:
    url: str
    home: Path
    log: Path
    chat_id: int
    empty_id: int
    chat_dir: Path
    tokenizer: Path

    def rows(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for f in sorted(self.chat_dir.glob("data-*.arrow")):
            with pa.memory_map(str(f)) as src:
                out += pa.ipc.open_stream(src).read_all().to_pylist()
        return out


def _register(url: str, path: Path) -> int:
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    csrf = token_in(opener.open(f"{url}/datasets").read().decode())
    body = urllib.parse.urlencode({"path": str(path), "csrf": csrf}).encode()
    with opener.open(urllib.request.Request(f"{url}/datasets", data=body, method="POST")) as r:
        final = r.geturl()  # the redirect to /datasets/<id> was followed
    match = re.search(r"/datasets/(\d+)$", final)
    assert match, f"registering {path} did not lead to a dataset page: {final}"
    return int(match.group(1))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """`draftdeck web` on a free port with a fresh home holding a chat dataset and an empty one."""
    home = tmp_path_factory.mktemp("dsweb") / "home"
    made = build_chat_dataset(home, max_len=40)
    empty = write_dataset(home / "datasets" / "empty-run", [], made["tokenizer"])
    with web_server(home, home, home.parent / "web.log") as url:
        yield Site(url, home, home.parent / "web.log", _register(url, made["dataset"]), _register(url, empty),
                   made["dataset"], made["tokenizer"])  # fmt: skip


@dataclass
class Seen:
    dialogs: list[str]
    errors: list[str]


@pytest.fixture
def tab(browser: Any, site: Site) -> Iterator[tuple[Any, Seen]]:
    """A page that records dialogs (an executed alert() would open one), script errors and CSP reports."""
    sync_api.expect.set_options(timeout=10_000)
    context = browser.new_context(base_url=site.url, viewport={"width": 1300, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    seen = Seen([], [])

    def on_dialog(d: Any) -> None:
        seen.dialogs.append(f"{d.type}: {d.message}")
        d.dismiss()

    pg.on("dialog", on_dialog)
    pg.on("pageerror", lambda e: seen.errors.append(str(e)))
    pg.on("console", lambda m: seen.errors.append(m.text)
          if m.type == "error" and "Failed to load resource" not in m.text else None)  # fmt: skip
    log_start = len(site.log.read_text(errors="replace"))
    try:
        yield pg, seen
    finally:
        context.close()
    assert seen.dialogs == [], f"a dialog fired: {seen.dialogs}"
    assert seen.errors == [], f"script errors or CSP violations: {seen.errors}"
    new_log = site.log.read_text(errors="replace")[log_start:]
    assert "Traceback" not in new_log, new_log[-3000:]


def _settled(pg: Any) -> None:
    """Wait until htmx has swapped and settled (no request, swap or settle class left on the page)."""
    pg.wait_for_function(
        "() => !document.querySelector('.htmx-request, .htmx-swapping, .htmx-settling, .htmx-added')"
    )


def _trained_chips(pg: Any) -> int:
    return int(pg.locator("#chips-main .tok.tr").count())


def test_page_through_rows_and_count_trained_chips(tab: tuple[Any, Seen], site: Site) -> None:
    pg, _ = tab
    expect = sync_api.expect
    rows = site.rows()
    pg.goto(f"/datasets/{site.chat_id}/rows/0")
    for n in range(len(rows)):
        expect(pg.locator("#row-n")).to_have_text(str(n))
        expect(pg).to_have_url(re.compile(rf"/datasets/{site.chat_id}/rows/{n}$"))
        assert _trained_chips(pg) == rows[n]["n_trained"] == sum(rows[n]["loss_mask"])
        assert pg.locator("#fact-n-trained").inner_text().split()[0] == str(rows[n]["n_trained"])
        assert pg.locator("#chips-main .tok").count() == len(rows[n]["input_ids"])
        if n + 1 < len(rows):
            pg.click("#nav-next")
    pg.click("#nav-next")  # past the last row: a message, the row stays
    expect(pg.locator("#sample-message")).to_contain_text("this is the last row")
    pg.click("#nav-prev")
    expect(pg.locator("#row-n")).to_have_text(str(len(rows) - 2))
    pg.go_back()  # the pushed URLs are real history entries
    expect(pg.locator("#row-n")).to_have_text(str(len(rows) - 1))
    pg.goto(f"/datasets/{site.chat_id}/rows/1")
    pg.locator("body").press("ArrowRight")
    expect(pg.locator("#row-n")).to_have_text("2")
    pg.locator("body").press("ArrowLeft")
    expect(pg.locator("#row-n")).to_have_text("1")
    with pg.expect_response(lambda r: "to=random" in r.url):
        pg.click("#nav-random")
    _settled(pg)
    expect(pg.locator("#row-n")).to_have_text(re.compile(r"^\d+$"))
    assert 0 <= int(pg.locator("#row-n").inner_text()) < len(rows)
    pg.fill("#jump-at", "2")
    pg.locator("#jump-at").press("Enter")
    expect(pg.locator("#row-n")).to_have_text("2")
    pg.goto(f"/datasets/{site.chat_id}/rows/{len(rows) + 10}")
    expect(pg.locator("#sample-message")).to_contain_text("is out of range")


def test_filters_and_search(tab: tuple[Any, Seen], site: Site) -> None:
    pg, _ = tab
    expect = sync_api.expect
    rows = site.rows()
    truncated = [n for n, r in enumerate(rows) if r["truncated"]]
    pg.goto(f"/datasets/{site.chat_id}/rows/0")
    pg.select_option("select[name=truncated]", "1")
    pg.click("#filters button[type=submit]")
    expect(pg.locator("#row-n")).to_have_text(str(truncated[0]))
    expect(pg.locator("#fact-truncated")).to_have_text("yes")
    expect(pg).to_have_url(re.compile(r"truncated=1"))
    expect(pg.locator("#row-pos")).to_contain_text(f"match 1 of {len(truncated)}")
    if len(truncated) > 1:
        pg.click("#nav-next")
        expect(pg.locator("#row-n")).to_have_text(str(truncated[1]))
    # the URL is shareable: opening it gives the same filtered view
    pg.goto(pg.url)
    expect(pg.locator("select[name=truncated]")).to_have_value("1")
    # text search over the decoded rows
    tok = load_tokenizer(site.tokenizer)
    want = [n for n, r in enumerate(rows) if "qubits" in tok.decode(r["input_ids"])]
    pg.goto(f"/datasets/{site.chat_id}/rows/0")
    pg.fill("input[name=q]", "qubits")
    pg.click("#filters button[type=submit]")
    expect(pg.locator("#row-n")).to_have_text(str(want[0]))
    expect(pg).to_have_url(re.compile(r"q=qubits"))
    assert "qubits" in "".join(pg.locator("#chips-main .tok").all_inner_texts())
    pg.fill("input[name=q]", "zebra crossing")
    pg.click("#filters button[type=submit]")
    expect(pg.locator("#sample-message")).to_contain_text("no row contains")
    pg.fill("input[name=q]", "")
    pg.fill("input[name=min_len]", "50")
    pg.fill("input[name=max_len]", "10")
    pg.click("#filters button[type=submit]")
    expect(pg.locator("#sample-message")).to_contain_text("the length range is empty")


def test_hover_a_token_and_toggle_anchors(tab: tuple[Any, Seen], site: Site) -> None:
    pg, _ = tab
    expect = sync_api.expect
    rows = site.rows()
    n = max(range(len(rows)), key=lambda i: rows[i]["n_trained"])
    mask = rows[n]["loss_mask"]
    pg.goto(f"/datasets/{site.chat_id}/rows/{n}")
    p = mask.index(1)
    chip = pg.locator(f'#chips-main .tok[data-p="{p}"]')
    chip.hover()
    tip = pg.locator("#tok-tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text(f"position{p}")
    expect(tip).to_contain_text(f"id{rows[n]['input_ids'][p]}")
    expect(tip).to_contain_text("mask1 (trained)")
    pg.locator('#chips-main .tok[data-p="0"]').hover()
    expect(tip).to_contain_text("mask0 (context)")
    # trained and context chips look different beyond colour: a pattern and a border style
    styles = pg.evaluate("""() => ['tr', 'cx'].map(c => {
        const s = getComputedStyle(document.querySelector('#chips-main .tok.' + c));
        return [s.backgroundImage, s.borderBottomStyle, s.borderTopStyle];
    })""")
    assert "gradient" in styles[0][0] and styles[1][0] == "none"
    assert styles[0][1] == "solid" and styles[1][2] == "dashed"
    # the toggle highlights exactly the valid DFlash anchors (mask at p and p+1)
    anchors = [i for i in range(len(mask) - 1) if mask[i] and mask[i + 1]]
    button = pg.locator("#sample .toggle-anchors")
    expect(button).to_have_attribute("aria-pressed", "false")
    outline_before = pg.locator(f'#chips-main .tok[data-p="{anchors[0]}"]').evaluate(
        "e => getComputedStyle(e).outlineStyle"
    )
    button.click()
    expect(button).to_have_attribute("aria-pressed", "true")
    expect(pg.locator("#chips-main")).to_have_class(re.compile(r"\bshow-anchors\b"))
    assert pg.locator("#chips-main .tok.anchor").count() == len(anchors)
    assert pg.locator("#fact-anchors").inner_text() == str(len(anchors))
    shown = pg.locator(f'#chips-main .tok[data-p="{anchors[0]}"]').evaluate(
        "e => getComputedStyle(e).outlineStyle"
    )
    assert outline_before == "none" and shown == "solid"
    # it stays on while paging
    pg.click("#nav-next")
    expect(pg.locator("#row-n")).to_have_text(str(n + 1) if n + 1 < len(rows) else str(n))
    expect(pg.locator("#sample .toggle-anchors")).to_have_attribute("aria-pressed", "true")
    pg.locator("#sample .toggle-anchors").click()
    expect(pg.locator("#chips-main")).not_to_have_class(re.compile(r"\bshow-anchors\b"))


def test_hostile_samples_never_execute(tab: tuple[Any, Seen], site: Site) -> None:
    pg, seen = tab
    expect = sync_api.expect
    tok = load_tokenizer(site.tokenizer)
    texts = [tok.decode(r["input_ids"]) for r in site.rows()]
    hostile = [n for n, t in enumerate(texts) if "<script>" in t or "javascript:" in t or "onerror" in t]
    assert len(hostile) >= 2
    for n in hostile:
        pg.goto(f"/datasets/{site.chat_id}/rows/{n}")
        expect(pg.locator("#source-conversation")).to_be_visible()  # the source panel loaded via htmx
        for sel in (".chips script", ".chips img", ".chips a", "#source-panel script", "#source-panel img",
                    "#source-panel a", "a[href^='javascript']"):  # fmt: skip
            assert pg.locator(sel).count() == 0, sel
        shown = "".join(pg.locator("#chips-main .tok").all_inner_texts())
        source = pg.locator("#source-conversation").inner_text()
        assert "<script>" in source or "javascript:" in source  # shown as text
        assert "<" in shown
        for chip in pg.locator("#chips-main .tok").all()[:60]:
            chip.hover()
        pg.click("#sample .toggle-anchors")
    # also through an htmx swap (navigation replaces the sample with a partial)
    pg.goto(f"/datasets/{site.chat_id}/rows/{hostile[0] - 1}")
    pg.click("#nav-next")
    expect(pg.locator("#row-n")).to_have_text(str(hostile[0]))
    expect(pg.locator("#source-conversation")).to_be_visible()
    pg.wait_for_timeout(300)
    assert seen.dialogs == []
    assert pg.evaluate("() => document.querySelectorAll('img, iframe, object, embed').length") == 0


def test_statistics_match_the_shards(tab: tuple[Any, Seen], site: Site) -> None:
    pg, _ = tab
    expect = sync_api.expect
    rows = site.rows()
    pg.goto(f"/datasets/{site.chat_id}/stats")
    expect(pg.locator("#chart-length")).to_have_attribute("data-drawn", re.compile(r"^\d+$"))
    expect(pg.locator("#chart-trained_fraction")).to_have_attribute("data-drawn", "10")
    assert pg.locator("#chart-length canvas").count() >= 1  # uPlot drew it
    # bars stand on zero (an axis from near the smallest bar made a smaller source look empty)
    for chart in ("#chart-length", "#chart-sources"):
        expect(pg.locator(chart)).to_have_attribute("data-y-min", "0")
    assert "hover a bar" in pg.locator("#chart-sources .u-legend").inner_text()
    assert pg.locator("#stat-rows").inner_text() == str(len(rows))
    assert pg.locator("#stat-tokens").inner_text() == f"{sum(len(r['input_ids']) for r in rows):,}"
    assert pg.locator("#stat-trained").inner_text() == f"{sum(r['n_trained'] for r in rows):,}"
    cells = pg.locator("#per-source tbody tr").first.locator("td").all_inner_texts()
    source_cell = pg.locator("#per-source tbody tr").first.locator("td").first
    assert source_cell.get_attribute("title") == rows[0]["source"]  # shown relative to its data root
    assert rows[0]["source"].endswith(cells[0])
    assert cells[1:] == [str(len(rows)), f"{sum(len(r['input_ids']) for r in rows):,}",
                         f"{sum(r['n_trained'] for r in rows):,}"]  # fmt: skip
    pg.locator("details summary").first.click()
    counts = [
        int(c.replace(",", "")) for c in pg.locator("#hist-length tbody td:nth-child(3)").all_inner_texts()
    ]
    edges = [
        float(c.replace(",", "")) for c in pg.locator("#hist-length tbody td:nth-child(1)").all_inner_texts()
    ]
    lengths = [len(r["input_ids"]) for r in rows]
    uppers = [*edges[1:], float("inf")]
    assert counts == [sum(1 for x in lengths if lo <= x < hi) for lo, hi in zip(edges, uppers, strict=True)]


def test_empty_output_alert_can_be_acknowledged(tab: tuple[Any, Seen], site: Site) -> None:
    pg, _ = tab
    expect = sync_api.expect
    pg.goto("/datasets")
    row = pg.locator(f'tr[data-dataset="{site.empty_id}"]')
    expect(row.locator(".badge-alert")).to_have_text("1")
    row.locator("a").first.click()
    alert = pg.locator('.dataset-alerts li[data-kind="empty_output"]')
    expect(alert).to_contain_text("has no rows")
    expect(pg.locator("#alert-count")).to_be_visible()
    alert.get_by_role("button", name="Acknowledge").click()
    expect(pg.locator('.dataset-alerts li[data-kind="empty_output"]')).to_contain_text("acknowledged")
    expect(pg.locator('.dataset-alerts li[data-kind="empty_output"] button')).to_have_count(0)
    pg.goto("/datasets")
    expect(pg.locator(f'tr[data-dataset="{site.empty_id}"] .badge-alert')).to_have_count(0)
