"""Tokenize with image roots (a job run by the service): an image file outside them is
`image_outside_roots`, both when the inputs are read and when a chunk's rows are tokenized (the chunk
task reads the images again), and nothing of it is stored beside the shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
import pytest

from draftdeck.chat.testing import qwen36_tokenizer
from draftdeck.drafter import tiny_vlm
from draftdeck.formats.model import Conversation, ImageRef, Message
from draftdeck.tokenize.options import TokenizeOptions
from draftdeck.tokenize.pipeline import tokenize_files, tokenize_rows


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vlm") / "target"
    shutil.copytree(qwen36_tokenizer(chat_template=tiny_vlm.CHAT_TEMPLATE), folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(tiny_vlm.preprocessor_config()))
    return folder


def _row(path: Path, i: int) -> Conversation:
    user = Message("user", f"<image>\nWhat is in picture {i}?", images=[ImageRef(path=str(path))])
    return Conversation(messages=[user, Message("assistant", f"Shapes, row {i}.")])


def test_outside_images_are_rejected_when_read_and_when_tokenized(vlm: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    inside, _ = tiny_vlm.write_tiny_images(root / "imgs", n=2)
    outside = tiny_vlm.write_tiny_images(tmp_path / "secret", n=1, seed=7)[0]  # other bytes
    assert outside.read_bytes() != inside.read_bytes()
    opts = TokenizeOptions(tokenizer=vlm, workers=1, image_roots=(str(root),))
    # a chunk's rows (as a chunk task gets them: already read)
    res = tokenize_rows([_row(inside, 0), _row(outside, 1)], opts)
    assert (res.report.rows_out, dict(res.report.rejected)) == (1, {"image_outside_roots": 1})
    # the inputs read by the job
    turns = [{"from": "human", "value": "<image>which?"}, {"from": "gpt", "value": "ok"}]
    rows = [{"conversations": turns, "images": [image]} for image in ("imgs/" + inside.name, str(outside))]
    src = root / "rows.jsonl"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    report = tokenize_files([src], tmp_path / "ds", opts)
    assert (report.rows_out, dict(report.rejected)) == (1, {"image_outside_roots": 1})
    stored = {p.read_bytes() for p in (tmp_path / "ds" / "images").iterdir()}
    assert stored == {inside.read_bytes()}
