"""Every page at 390 px (a phone) and 1366 px: nothing widens the document past the viewport. Pages are
filled the way users fill them: a scan of a file deep in a long path, the convert and tokenize its
pages offer, the dataset that made, another tokenization to compare with, and an alert.

    DD_SCREENS=var/screens-pages pytest -m browser tests/browser/test_narrow.py   # also writes PNGs
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from draftdeck.chat.testing import small_bpe_tokenizer
from tests.browser.harness import Server
from tests.support.datasets import sample_conversations

pytestmark = pytest.mark.browser

WIDTHS = {"narrow": (390, 844), "desktop": (1366, 900)}
LONG = "ultrachat_messages_regenerated_by_the_target_model_at_temperature_0_with_max_tokens_4096"


@pytest.fixture(scope="module")
def pages(server: Server) -> Iterator[dict[str, str]]:
    deep = server.data_dir / "team-drafters" / "qwen3-8b-regenerated-2026-11-30" / "ultrachat"
    deep.mkdir(parents=True, exist_ok=True)
    src = deep / f"{LONG}.jsonl"
    src.write_text("".join(json.dumps({"messages": c}) + "\n" for c in sample_conversations()))
    tok = server.data_dir / "tokenizers" / "qwen3-8b-instruct-tokenizer-with-a-long-name"
    if not tok.exists():
        shutil.copytree(small_bpe_tokenizer(), tok)
    scan = server.submit("scan", inputs=str(src))
    server.wait_status(scan)
    convert = server.submit("convert", inputs=str(src))
    converted = server.wait_status(convert, timeout=60)
    assert converted["status"] == "succeeded", converted
    tokenize = server.submit("tokenize", inputs=[o["path"] for o in converted["outputs"]], tokenizer=str(tok))
    tokenized = server.wait_status(tokenize, timeout=120)
    assert tokenized["status"] == "succeeded", tokenized["error"]
    # the same conversations cut at 24 tokens, into a folder with a long name: the dataset to compare with
    # (most rows lose every trained token there: allowed, since a heavy loss fails a job by default)
    again = server.submit("tokenize", inputs=[o["path"] for o in converted["outputs"]], tokenizer=str(tok),
                          seq_length=24, max_rejected=1.0,
                          out=str(server.data_dir / "datasets" / f"{LONG}-seq24"))  # fmt: skip
    redone = server.wait_status(again, timeout=120)
    assert redone["status"] == "succeeded", redone["error"]
    failed_src = server.data_dir / "exports" / "sharegpt_export_that_came_out_empty.jsonl"
    failed_src.parent.mkdir(exist_ok=True)
    failed_src.write_text("")
    failed = server.submit("scan", inputs=str(failed_src))
    server.wait_status(failed)
    yield {"scan": str(scan), "convert": str(convert), "tokenize": str(tokenize), "failed": str(failed),
           "again": str(again)}  # fmt: skip


def _dataset_of(page: Any, job: str) -> int:
    page.goto(f"/jobs/{job}")
    return int(page.locator("#next-steps a").first.get_attribute("href").rsplit("/", 1)[1])


def _urls(page: Any, pages: dict[str, str]) -> list[tuple[str, str]]:
    first, second = _dataset_of(page, pages["tokenize"]), _dataset_of(page, pages["again"])
    urls = [("jobs", "/jobs"), ("alerts", "/alerts"), ("datasets", "/datasets"), ("runs", "/runs"),
            ("login", "/login"), ("error-404", "/jobs/987654"),
            ("dataset", f"/datasets/{first}"), ("sample", f"/datasets/{first}/rows/0"),
            ("stats", f"/datasets/{first}/stats"), ("delete", f"/datasets/{first}/delete"),
            ("compare", f"/datasets/compare?a={first}&b={second}&row=0")]  # fmt: skip
    urls += [(f"job-{k}", f"/jobs/{pages[k]}") for k in ("scan", "convert", "tokenize", "failed")]
    kinds = ("scan", "convert", "regenerate", "tokenize", "train", "eval", "export-drafter")
    urls += [(f"new-{k}", f"/jobs/new?kind={k}") for k in kinds]
    return urls


def _settle(page: Any, name: str) -> None:
    if name == "stats":
        page.wait_for_selector(".chart[data-drawn]")
    if name == "sample":
        page.wait_for_selector("#source-panel #source-conversation, #source-panel .notice")


def test_chart_labels_thin_out_on_a_phone(browser: Any, server: Server, pages: dict[str, str]) -> None:
    """The trained-fraction chart has 10 bars: all labelled on a desktop, but on a phone only as many
    as fit side by side (the labels overlapped)."""
    shown = {}
    for label, (w, h) in WIDTHS.items():
        context = browser.new_context(base_url=server.url, viewport={"width": w, "height": h})
        page = context.new_page()
        page.goto(f"/datasets/{_dataset_of(page, pages['tokenize'])}/stats")
        chart = page.locator("#chart-trained_fraction")
        chart.wait_for()
        page.wait_for_selector("#chart-trained_fraction[data-drawn]")
        shown[label] = int(chart.get_attribute("data-x-labels") or 0)
        context.close()
    assert shown["desktop"] == 10 and 0 < shown["narrow"] <= 5, shown


def test_no_page_is_wider_than_a_phone(browser: Any, server: Server, pages: dict[str, str]) -> None:
    shots = Path(os.environ["DD_SCREENS"]) if os.environ.get("DD_SCREENS") else None
    too_wide: list[str] = []
    context = browser.new_context(base_url=server.url, viewport={"width": 390, "height": 844})
    urls = _urls(context.new_page(), pages)
    context.close()
    for label, (w, h) in WIDTHS.items():
        if label == "desktop" and shots is None:
            continue  # the assertion is about phones; desktop shots are for looking at
        context = browser.new_context(base_url=server.url, viewport={"width": w, "height": h})
        page = context.new_page()
        for name, url in urls:
            page.goto(url)
            page.wait_for_load_state("networkidle")
            _settle(page, name)
            width = page.evaluate("document.documentElement.scrollWidth")
            if width > w:
                wide = page.evaluate(
                    """(w) => [...document.querySelectorAll('body *')]
                    .filter(e => e.getBoundingClientRect().right > w + 1).slice(0, 4)
                    .map(e => `${e.tagName}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`)
                    """,
                    w,
                )
                too_wide.append(f"{name} ({url}) at {w} px: scroll width {width}; {wide}")
            if shots is not None:
                shots.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(shots / f"{name}-{label}.png"), full_page=True)
        context.close()
    assert not too_wide, "\n".join(too_wide)
