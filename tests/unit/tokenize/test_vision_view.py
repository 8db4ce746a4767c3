"""The sample page's tokens view of a row with images: each image's tokens drawn as ONE greyed chip with
its count (draftdeck.browse.tokens.fold_images), not one chip per image token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from draftdeck.browse.info import load_info
from draftdeck.browse.sample import read_sample
from draftdeck.browse.tokens import Chip, fold_images
from draftdeck.chat.testing import qwen36_tokenizer
from draftdeck.drafter import tiny_vlm
from draftdeck.formats.model import Conversation, ImageRef, Message
from draftdeck.tokenize.options import TokenizeOptions
from draftdeck.tokenize.pipeline import tokenize_conversations


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("view")
    target = root / "target"
    shutil.copytree(qwen36_tokenizer(chat_template=tiny_vlm.CHAT_TEMPLATE), target)
    (target / "preprocessor_config.json").write_text(json.dumps(tiny_vlm.preprocessor_config()))
    pics = tiny_vlm.write_tiny_images(root / "pics", n=2)
    conv = Conversation(messages=[
        Message("user", "Compare <image> with <image> please.", images=[ImageRef(path=str(p)) for p in pics]),
        Message("assistant", "The first is red."),
    ])  # fmt: skip
    tokenize_conversations([conv], root / "ds", TokenizeOptions(tokenizer=target, workers=1))
    return root / "ds"


def test_each_image_is_one_greyed_chip_with_its_token_count(dataset: Path) -> None:
    sample = read_sample(load_info(dataset), 0)
    row_images = json.loads((dataset / "manifest.json").read_text())["images"]
    images = [c for c in sample.chips if c.kind == "image"]
    assert len(images) == 2
    grids = sample_grids(dataset)
    for chip, (t, h, w), name in zip(images, grids, read_names(dataset), strict=True):
        assert chip.span == t * h * w // 4 and chip.text == f"image · {chip.span} tokens"
        assert chip.mask == 0 and "image" in chip.cls.split() and chip.image == name
    assert {f["filename"] for f in row_images} == {c.image for c in images}
    # every other token keeps its chip: the chips stand for all the row's tokens
    assert sum(c.span for c in sample.chips) == sample.n_tokens
    assert not any(c.text == "<|image_pad|>" for c in sample.chips)


def test_the_chips_template_draws_one_span_per_image(dataset: Path) -> None:
    from jinja2 import Environment, FileSystemLoader

    root = Path(__file__).resolve().parents[3] / "templates"
    env = Environment(loader=FileSystemLoader(str(root)), autoescape=True)
    sample = read_sample(load_info(dataset), 0)
    html = env.get_template("partials/dataset_chips.html").render(sample=sample, chips_id="chips-main")
    assert html.count('class="tok cx image"') == 2
    assert "image · 16 tokens" in html and ">&lt;|image_pad|&gt;</span>" not in html
    assert "<img" not in html  # no dataset to serve them from (the compare page's sides)
    from types import SimpleNamespace

    thumbs = env.get_template("partials/dataset_chips.html").render(
        sample=sample, chips_id="c", ds=SimpleNamespace(id=7)
    )
    names = [c.image for c in sample.chips if c.kind == "image"]
    assert [f'<img class="image-thumb" src="/datasets/7/images/{n}"' in thumbs for n in names] == [True, True]


def test_fold_keeps_text_chips_and_counts_runs() -> None:
    pad = [Chip(pos=i, id=9, mask=0, text="<|image_pad|>", kind="special") for i in range(1, 4)]
    chips = [Chip(pos=0, id=1, mask=0, text="a"), *pad, Chip(pos=4, id=2, mask=1, text="b")]
    folded = fold_images(chips, ["x.png"])
    assert [(c.kind, c.span, c.image) for c in folded] == [
        ("text", 1, None),
        ("image", 3, "x.png"),
        ("text", 1, None),
    ]


def sample_grids(dataset: Path) -> list[tuple[int, int, int]]:
    from draftdeck.shards.store import ShardDataset

    return [grid for _, grid in ShardDataset(dataset).row_images(0)]


def read_names(dataset: Path) -> list[str]:
    from draftdeck.shards.store import ShardDataset

    return list(ShardDataset(dataset).row(0)["images"])


def test_inspect_shows_each_image_once_with_its_count(dataset: Path) -> None:
    from transformers import AutoTokenizer

    from draftdeck.cli.inspect import render_row
    from draftdeck.shards.store import ShardDataset

    ds = ShardDataset(dataset)
    row = ds.row(0)
    tok = AutoTokenizer.from_pretrained(
        json.loads((dataset / "manifest.json").read_text())["tokenizer"]["path"]
    )
    text = render_row(tok, row["input_ids"], row["loss_mask"]).plain
    counts = [t * h * w // 4 for _, (t, h, w) in ds.row_images(0)]
    assert [f"[image · {n} tokens]" in text for n in counts] == [True, True]
    assert "<|image_pad|>" not in text and "The first is red." in text.replace("·", " ")


def test_the_speculators_export_keeps_each_rows_images(dataset: Path, tmp_path: Path) -> None:
    from draftdeck.shards.store import ShardDataset
    from draftdeck.shards.tools import export_speculators_jsonl

    ds = ShardDataset(dataset)
    assert export_speculators_jsonl(ds, tmp_path / "out.jsonl") == 1
    (row,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [Path(p) for p in row["images"]] == [p.resolve() for p, _ in ds.row_images(0)]
    assert row["image_grid_thw"] == ds.row(0)["image_grid_thw"] and row["input_ids"] == ds.row(0)["input_ids"]
