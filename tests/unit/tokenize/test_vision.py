"""Tokenizing rows with images against a vision-language target (draftdeck.tokenize.vision): each image
expanded to its grid's token count with loss mask 0 there, the images stored once beside the shards,
a text target refusing them by name, the chunked run carrying them to the final folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from draftdeck.chat.testing import qwen36_tokenizer
from draftdeck.drafter import tiny_vlm
from draftdeck.formats.model import Conversation, ImageRef, Message, SourceRef
from draftdeck.shards.store import COLUMNS, ShardDataset, ShardWriter, schema, write_block
from draftdeck.tokenize.chunks import tokenize_files_chunked
from draftdeck.tokenize.options import TokenizeOptions
from draftdeck.tokenize.pipeline import tokenize_conversations, tokenize_files, tokenize_rows
from draftdeck.tokenize.vision import Vision

IMAGE, START, END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3.5-style VLM's tokenizer folder: the real Qwen3.5/3.6 vocabulary (its vision tokens),
    the tiny VLM's template (image parts as Qwen3.5 renders them) and its PIL image processor."""
    folder = tmp_path_factory.mktemp("vlm") / "target"
    shutil.copytree(qwen36_tokenizer(chat_template=tiny_vlm.CHAT_TEMPLATE), folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(tiny_vlm.preprocessor_config()))
    return folder


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return tiny_vlm.write_tiny_images(tmp_path_factory.mktemp("pictures"), n=4)


def _grid(vlm: Path, path: Path) -> tuple[int, int, int]:
    from PIL import Image

    processor = tiny_vlm.load_image_processor(vlm)
    with Image.open(path) as img:
        t, h, w = (int(v) for v in np.asarray(processor(images=[img.convert("RGB")])["image_grid_thw"])[0])
    return t, h, w


def _image_row(pictures: list[Path], i: int) -> Conversation:
    """A row as the OpenAI reader gives an image_url data URI (bytes) and one as LLaMA-Factory's
    `<image>` with a path gives it, in one conversation each, alternately."""
    if i % 2 == 0:
        ref = ImageRef(data=pictures[i % len(pictures)].read_bytes(), mime="image/png")
        user = Message("user", f"<image>\nWhat is in picture {i}?", images=[ref])
    else:
        refs = [ImageRef(path=str(pictures[i % len(pictures)])), ImageRef(path=str(pictures[0]))]
        user = Message("user", f"Compare <image> with <image>, row {i}.", images=refs)
    return Conversation(messages=[user, Message("assistant", f"Shapes in colours, row {i}.")],
                        source=SourceRef("mixed.jsonl", i + 1))  # fmt: skip


def test_every_image_expands_to_its_grid_with_loss_mask_zero(vlm: Path, pictures: list[Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(vlm))
    ids_of = {t: tok.convert_tokens_to_ids(t) for t in (IMAGE, START, END)}
    convs = [_image_row(pictures, i) for i in range(6)]
    res = tokenize_rows(convs, TokenizeOptions(tokenizer=vlm, workers=1))
    assert res.report.rows_out == 6 and not res.report.rejected
    assert res.report.counts["images"] == 9  # 3 rows of one image, 3 of two
    assert res.report.counts["image_tokens"] == sum(
        t * h * w // 4 for r in res.rows for t, h, w in zip(*[iter(r.image_grid_thw)] * 3, strict=True)
    )
    for i, row in enumerate(res.rows):
        refs = convs[i].messages[0].images
        assert len(row.images) == len(refs)
        ids = row.input_ids
        runs = np.split(
            np.flatnonzero(ids == ids_of[IMAGE]),
            np.flatnonzero(np.diff(np.flatnonzero(ids == ids_of[IMAGE])) > 1) + 1,
        )
        for j, run in enumerate(runs):
            grid = tuple(row.image_grid_thw[3 * j : 3 * j + 3])
            src = pictures[i % len(pictures)] if (i % 2 == 0 or j == 0) else pictures[0]
            assert grid == _grid(vlm, src)
            t, h, w = grid
            assert len(run) == t * h * w // 4  # merge_size 2: 4 patches a token
            assert ids[run[0] - 1] == ids_of[START] and ids[run[-1] + 1] == ids_of[END]
        special = np.isin(ids, list(ids_of.values()))
        assert special.sum() == sum(len(r) + 2 for r in runs)
        assert not row.loss_mask[special].any()
        # the trained tokens decode to the answer and its end of turn, as for text rows
        assert (
            tok.decode(ids[row.loss_mask.astype(bool)].tolist()) == f"Shapes in colours, row {i}.<|im_end|>"
        )


def test_dataset_stores_each_image_once_and_the_manifest_lists_it(vlm: Path, pictures: list[Path],
                                                                  tmp_path: Path) -> None:  # fmt: skip
    convs = [_image_row(pictures, i) for i in range(8)] + [
        Conversation(messages=[Message("user", "no picture <image> here"), Message("assistant", "Fine.")])
    ]
    report = tokenize_conversations(convs, tmp_path / "ds", TokenizeOptions(tokenizer=vlm, workers=1))
    assert report.rows_out == 9
    ds = ShardDataset(tmp_path / "ds")
    assert ds.schema.names == [*COLUMNS, "images", "image_grid_thw"]
    stored = sorted(p.name for p in ds.images_dir.iterdir())
    assert stored == sorted(f.filename for f in ds.manifest.images or [])
    assert len(stored) == len(pictures)  # 13 image occurrences, 4 distinct pictures: 4 files
    named = {n for i in range(len(ds)) for n in ds.row(i)["images"]}
    assert named == set(stored)
    assert ds.row(8)["images"] == [] and ds.row(8)["image_grid_thw"] == []  # a literal "<image>": text
    path, grid = ds.row_images(1)[1]
    assert path.read_bytes() == pictures[0].read_bytes() and grid == _grid(vlm, pictures[0])
    info = json.loads((tmp_path / "ds" / "dataset_info.json").read_text())
    assert list(info["features"]) == ds.schema.names


def test_a_text_target_rejects_image_rows_by_name(pictures: list[Path]) -> None:
    text_target = qwen36_tokenizer(chat_template=tiny_vlm.CHAT_TEMPLATE)  # no preprocessor_config.json
    convs = [_image_row(pictures, i) for i in range(3)] + [
        Conversation(messages=[Message("user", "hi"), Message("assistant", "hello")])
    ]
    res = tokenize_rows(convs, TokenizeOptions(tokenizer=text_target, workers=1))
    assert res.report.rejected == {"multimodal_content": 3}
    assert res.report.rows_out == 1 and res.rows[0].images == []


def test_bad_images_and_placeholders_are_named_rejections(
    vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    def row(content: str, refs: list[ImageRef], role: str = "user") -> Conversation:
        if role == "assistant":
            return Conversation(messages=[Message("user", "q"), Message("assistant", content, images=refs)])
        msgs = [Message("user", content, images=refs), Message("assistant", "a")]
        return Conversation(messages=msgs)

    convs = [
        row("<image> x", [ImageRef(path=str(tmp_path / "gone.png"))]),
        row("<image> x", [ImageRef(data=b"not an image")]),
        row("<image> x", [ImageRef(url="https://example.com/a.png")]),
        row("<image> <image> x", [ImageRef(path=str(pictures[0]))]),
        row("here <image>", [ImageRef(path=str(pictures[0]))], role="assistant"),
        row("<image> fine", [ImageRef(path=str(pictures[1]))]),
    ]
    res = tokenize_rows(convs, TokenizeOptions(tokenizer=vlm, workers=1))
    assert res.report.rejected == {"image_missing": 1, "image_unreadable": 1, "image_url_unread": 1,
                                   "image_placeholder_mismatch": 1, "multimodal_content": 1}  # fmt: skip
    assert res.report.rows_out == 1


def test_truncation_never_cuts_an_image_in_two(vlm: Path, pictures: list[Path]) -> None:
    conv = Conversation(messages=[
        Message("user", "<image> then <image> end", images=[ImageRef(path=str(p)) for p in pictures[:2]]),
        Message("assistant", "Answer."),
    ])  # fmt: skip
    whole = tokenize_rows([conv], TokenizeOptions(tokenizer=vlm, workers=1)).rows[0]
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(str(vlm)).convert_tokens_to_ids(IMAGE)
    second = np.flatnonzero(whole.input_ids == pad)[-1]  # cut inside the second image's tokens
    cut = tokenize_rows([conv], TokenizeOptions(tokenizer=vlm, workers=1, seq_length=int(second))).report
    assert cut.rejected == {"no_trained_tokens": 1}  # the answer was cut off anyway
    # a row that keeps its answer: the image after the answer's prompt is not cut, the first is whole
    first, second = ImageRef(path=str(pictures[0])), ImageRef(path=str(pictures[1]))
    short = Conversation(messages=[
        Message("user", "<image> first", images=[first]), Message("assistant", "A."),
        Message("user", "<image> second", images=[second]), Message("assistant", "B."),
    ])  # fmt: skip
    full = tokenize_rows([short], TokenizeOptions(tokenizer=vlm, workers=1)).rows
    assert [len(r.images) for r in full] == [2]
    cut_at = int(np.flatnonzero(full[0].input_ids == pad)[-1]) - 3  # inside the second image
    kept = tokenize_rows([short], TokenizeOptions(tokenizer=vlm, workers=1, seq_length=cut_at)).rows[0]
    assert kept.images == full[0].images[:1] and kept.image_grid_thw == full[0].image_grid_thw[:3]
    t, h, w = kept.image_grid_thw
    assert int((kept.input_ids == pad).sum()) == t * h * w // 4  # the first image whole, none of the second
    assert kept.input_ids[-1] != AutoTokenizer.from_pretrained(str(vlm)).convert_tokens_to_ids(START)


def test_a_file_mixing_openai_and_llamafactory_images_keeps_every_row_chunked_or_not(
    vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    """Issue 55's done-when, tokenize half: OpenAI image_url rows (a data URI; a file path) and
    LLaMA-Factory `<image>` rows (a path relative to the file) in one file, with text rows between,
    read by the readers, every row kept, each image its grid's tokens with loss mask 0; the chunked run
    writes the same rows and the same image files as the in-process one."""
    import base64

    from transformers import AutoTokenizer

    folder = tmp_path / "data"
    (folder / "pics").mkdir(parents=True)
    rows: list[dict[str, object]] = []
    for i in range(9):
        pic = pictures[i % len(pictures)]
        shutil.copy(pic, folder / "pics" / pic.name)
        if i % 3 == 2:  # text rows between: chunks without any image
            rows.append({"messages": [{"role": "user", "content": f"text {i}"},
                                      {"role": "assistant", "content": f"Text answer {i}."}]})  # fmt: skip
        elif i % 3 == 1:
            uri = "data:image/png;base64," + base64.b64encode(pic.read_bytes()).decode()
            parts = [
                {"type": "text", "text": f"What is in row {i}?"},
                {"type": "image_url", "image_url": {"url": uri}},
            ]
            rows.append({"messages": [{"role": "user", "content": parts},
                                      {"role": "assistant", "content": f"Picture answer {i}."}]})  # fmt: skip
        else:
            turns = [
                {"from": "human", "value": f"<image> row {i}"},
                {"from": "gpt", "value": f"Shapes, row {i}."},
            ]
            rows.append({"conversations": turns, "images": [f"pics/{pic.name}"]})
    src = folder / "mixed.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    opts = TokenizeOptions(tokenizer=vlm, workers=1, shard_rows=3)
    one = tokenize_files([src], tmp_path / "one", opts)
    assert one.rows_out == 9 and not one.rejected
    a = ShardDataset(tmp_path / "one")
    pad = AutoTokenizer.from_pretrained(str(vlm)).convert_tokens_to_ids(IMAGE)
    for n in range(len(a)):
        row, want = a.row(n), 0 if n % 3 == 2 else 1
        ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
        assert len(row["images"]) == want
        images = a.row_images(n)
        assert int((ids == pad).sum()) == sum(t * h * w // 4 for _, (t, h, w) in images)
        assert not mask[ids == pad].any()
        for path, grid in images:
            assert path.read_bytes() == pictures[n % len(pictures)].read_bytes() and grid == _grid(vlm, path)
    chunked = tokenize_files_chunked([src], tmp_path / "chunked", tmp_path / "parts", opts, chunk_rows=3)
    assert chunked.rows_out == 9
    b = ShardDataset(tmp_path / "chunked")
    assert a.table.to_pylist() == b.table.to_pylist()
    assert a.manifest.images == b.manifest.images
    assert sorted(p.name for p in b.images_dir.iterdir()) == [f.filename for f in b.manifest.images or []]


def test_chunk_shards_with_and_without_images_share_one_schema(tmp_path: Path) -> None:
    from draftdeck.shards.store import Block
    from draftdeck.tokenize.chunks import recut

    text = Block(np.arange(4, dtype=np.int32), np.ones(4, np.uint8), np.asarray([2, 2]), ["a", "a"], [0, 1],
                 [-1, -1], [False, False])  # fmt: skip
    pics = Block(np.arange(3, dtype=np.int32), np.ones(3, np.uint8), np.asarray([3]), ["b"], [0], [-1],
                 [False], images=[["x.png"]], image_grids=[[1, 2, 2]])  # fmt: skip
    first = write_block(tmp_path / "chunk-00000.arrow", text)
    second = write_block(tmp_path / "chunk-00001.arrow", pics, schema(multimodal=True))
    final = recut(tmp_path, [first, second], 2)
    tables = []
    for s in final:
        with pa.memory_map(str(tmp_path / s.filename)) as f:
            tables.append(pa.ipc.open_stream(f).read_all())
    assert all(t.schema.names == schema(multimodal=True).names for t in tables)
    assert [r for t in tables for r in t.column("images").to_pylist()] == [[], [], ["x.png"]]
    # the in-process writer: a shard of text rows written before the first image is written again
    writer = ShardWriter(tmp_path / "w", shard_rows=2)
    writer.add_block(text)
    writer.add_block(pics)
    for s in writer.close():
        with pa.memory_map(str(tmp_path / "w" / s.filename)) as f:
            assert pa.ipc.open_stream(f).schema.names == schema(multimodal=True).names


def test_text_datasets_keep_the_text_schema_and_image_datasets_load_in_datasets(
    vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    import datasets
    from datasets import Features, List, Value

    from draftdeck.shards.store import IMAGE_COLUMNS, features

    assert schema().names == list(COLUMNS)
    assert schema() == schema(multimodal=False)
    every = {**COLUMNS, **IMAGE_COLUMNS}
    theirs = Features({n: List(Value(d[0])) if isinstance(d, list) else Value(d) for n, d in every.items()})
    assert schema(multimodal=True).equals(theirs.arrow_schema, check_metadata=True)
    assert features(multimodal=True) == theirs.to_dict()
    convs = [
        _image_row(pictures, 1),
        Conversation(messages=[Message("user", "hi"), Message("assistant", "yo")]),
    ]
    tokenize_conversations(convs, tmp_path / "ds", TokenizeOptions(tokenizer=vlm, workers=1))
    loaded = datasets.load_from_disk(str(tmp_path / "ds"))
    assert loaded.column_names == list(every)
    assert (
        len(loaded[0]["images"]) == 2 and len(loaded[0]["image_grid_thw"]) == 6 and loaded[1]["images"] == []
    )


def test_fast_grid_is_the_processors_for_many_sizes(vlm: Path) -> None:
    import io

    from PIL import Image
    from transformers import AutoTokenizer

    vision = Vision.load(vlm, AutoTokenizer.from_pretrained(str(vlm)))
    assert vision is not None
    for width, height in [(64, 64), (17, 300), (1000, 33), (640, 480), (31, 31), (129, 257)]:
        buf = io.BytesIO()
        Image.new("RGB", (width, height), (9, 9, 9)).save(buf, format="PNG")
        fast = vision._fast_grid(width, height)
        assert fast is not None and fast == vision._full_grid(buf.getvalue()), (width, height)


def test_an_image_first_seen_on_a_rejected_row_is_stored_for_a_later_kept_row(
    vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    ref = ImageRef(path=str(pictures[3]))
    long = Conversation(messages=[Message("user", "<image> " + "word " * 200, images=[ref]),
                                  Message("assistant", "A long one.")])  # fmt: skip
    short = Conversation(messages=[Message("user", "<image> short", images=[ImageRef(path=str(pictures[3]))]),
                                   Message("assistant", "A short one.")])  # fmt: skip
    # the long row is cut at 120 tokens after its image: its answer is gone, so it is rejected after its
    # image was placed (the file must still be written for the short row that shows it too)
    opts = TokenizeOptions(tokenizer=vlm, workers=1, seq_length=120, max_rejected=0.9)
    report = tokenize_conversations([long, short], tmp_path / "ds", opts)
    assert report.rejected == {"no_trained_tokens": 1} and report.rows_out == 1
    ds = ShardDataset(tmp_path / "ds")
    ((path, _),) = ds.row_images(0)
    assert path.read_bytes() == pictures[3].read_bytes()


SPLITTING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.content is string %}{% if m.role == 'assistant' and not loop.last %}[earlier] {% endif %}"
    "{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_split_rows_hold_the_images_of_the_turns_they_render(
    vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    """A template that renders earlier answers otherwise (as Qwen3.5 strips their reasoning) splits the
    conversation into a row per answer: each row holds the images of the turns it renders, no more."""
    template = tmp_path / "splitting.jinja"
    template.write_text(SPLITTING_TEMPLATE)
    first, second = ImageRef(path=str(pictures[0])), ImageRef(path=str(pictures[1]))
    conv = Conversation(messages=[
        Message("user", "<image> one", images=[first]), Message("assistant", "First answer."),
        Message("user", "<image> two", images=[second]), Message("assistant", "Second answer."),
    ])  # fmt: skip
    res = tokenize_rows([conv], TokenizeOptions(tokenizer=vlm, chat_template=template, workers=1))
    assert [r.turn for r in res.rows] == [0, 1]
    one, two = res.rows
    assert len(one.images) == 1 and len(two.images) == 2 and two.images[0] == one.images[0]
    assert one.image_grid_thw == list(_grid(vlm, pictures[0]))
    assert two.image_grid_thw == [*_grid(vlm, pictures[0]), *_grid(vlm, pictures[1])]


def test_a_process_pool_writes_what_one_process_writes(
    vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    """Pool processes check and hand over each picture on their own: the rows and files are the same."""
    convs = [_image_row(pictures, i) for i in range(40)]
    for workers in (1, 2):
        opts = TokenizeOptions(tokenizer=vlm, workers=workers, chunk_size=8, shard_rows=15)
        tokenize_conversations(convs, tmp_path / f"w{workers}", opts)
    one, two = ShardDataset(tmp_path / "w1"), ShardDataset(tmp_path / "w2")
    assert one.table.to_pylist() == two.table.to_pylist() and len(one) == 40
    assert one.manifest.images == two.manifest.images and len(one.manifest.images or []) == len(pictures)


def test_the_tokenize_command_says_what_it_stored(vlm: Path, pictures: list[Path], tmp_path: Path) -> None:
    import subprocess
    import sys

    turns = [
        [{"from": "human", "value": f"<image> row {i}"}, {"from": "gpt", "value": f"A {i}."}]
        for i in range(4)
    ]
    rows = [{"conversations": t, "images": [str(pictures[i % 2])]} for i, t in enumerate(turns)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli = Path(sys.executable).parent / "draftdeck"
    argv = [
        str(cli),
        "tokenize",
        str(src),
        "--tokenizer",
        str(vlm),
        "--out",
        str(tmp_path / "ds"),
        "--workers",
        "1",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    tokens = sum(t * h * w // 4 for p in pictures[:2] for t, h, w in [_grid(vlm, p)]) * 2
    said = done.stdout + done.stderr
    assert f"images: 4 in the rows, {tokens:,} image tokens (loss mask 0)" in " ".join(said.split())


def test_a_template_that_drops_image_parts_rejects_the_row_saying_so(
    vlm: Path, pictures: list[Path], tmp_path: Path
) -> None:
    from draftdeck.chat.templates import CHATML_SIMPLE

    template = tmp_path / "text_only.jinja"
    template.write_text(CHATML_SIMPLE)  # renders a message's content only when it is a string
    res = tokenize_rows(
        [_image_row(pictures, 1)], TokenizeOptions(tokenizer=vlm, chat_template=template, workers=1)
    )
    assert res.report.rejected == {"template_error": 1}
    (example,) = res.report.to_dict()["examples"]["template_error"]
    assert example["reason"].startswith("the chat template rendered 0 <|image_pad|> for 2 image(s)")
