"""The sample page of a dataset with images, in Debian's Chromium against a real `draftdeck web`: each
image's tokens are ONE greyed chip with its count and its picture's thumbnail (served by the dataset's
stored-image route), at 1366 and at 390 px without a sideways scroll (issue 55)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from draftdeck.chat.testing import qwen36_tokenizer
from draftdeck.drafter import tiny_vlm
from draftdeck.tokenize.options import TokenizeOptions
from draftdeck.tokenize.pipeline import tokenize_files
from tests.browser.harness import CHROMIUM
from tests.browser.test_datasets import _register
from tests.support.datasets import web_server

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent (apt-get install chromium)"
    ),
]


def test_each_image_is_one_chip_with_its_count_and_thumbnail(tmp_path: Path, browser: Any) -> None:
    """The session's browser (conftest.py): a second sync Playwright in the same process is refused
    once the session's has started."""
    home = tmp_path / "home"
    target = home / "target"
    shutil.copytree(qwen36_tokenizer(chat_template=tiny_vlm.CHAT_TEMPLATE), target)
    (target / "preprocessor_config.json").write_text(json.dumps(tiny_vlm.preprocessor_config()))
    pics = tiny_vlm.write_tiny_images(home / "pics", n=3)
    question = "Two pictures: <image> and <image>. Which has more circles?"
    row = {"conversations": [{"from": "human", "value": question},
                             {"from": "gpt", "value": "The second one has more circles."}],
           "images": [f"pics/{pics[0].name}", f"pics/{pics[2].name}"]}  # fmt: skip
    src = home / "rows.jsonl"
    src.write_text(json.dumps(row) + "\n")
    dataset = home / "datasets" / "vlm"
    report = tokenize_files([src], dataset, TokenizeOptions(tokenizer=target, workers=1))
    assert report.rows_out == 1, report.rejected
    with web_server(home, home, tmp_path / "web.log") as url:
        ds = _register(url, dataset)
        for width in (1366, 390):
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(f"{url}/datasets/{ds}/rows/0")
            page.wait_for_selector("#chips-main .tok.image img")
            chips = page.eval_on_selector_all("#chips-main .tok.image", "els => els.map(e => e.textContent)")
            assert chips == ["image · 16 tokens", "image · 32 tokens"]
            page.wait_for_function(
                "[...document.querySelectorAll('#chips-main .image-thumb')].every(i => i.complete)"
            )
            widths = page.eval_on_selector_all(
                "#chips-main .image-thumb", "els => els.map(i => i.naturalWidth)"
            )
            assert widths == [64, 64], "each thumbnail is its picture, loaded"
            pads = page.eval_on_selector_all(
                "#chips-main .tok", "els => els.filter(e => e.textContent === '<|image_pad|>').length"
            )
            assert pads == 0
            wide = page.evaluate(
                "[...document.querySelectorAll('body *')]"
                f".filter(e => e.getBoundingClientRect().right > {width})"
                ".map(e => e.tagName + '.' + e.className + ': ' + (e.textContent || '').slice(0, 60))"
            )
            assert wide == [], "nothing runs off the side"
            page.close()
