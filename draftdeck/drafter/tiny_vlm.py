"""A tiny, offline vision-language world (issue 55): a random Qwen3.5-style VLM (the hybrid Gated
DeltaNet text model of `tiny_targets`, a 1-layer vision tower), its tokenizer with Qwen's vision special
tokens and a chat template that renders image parts as Qwen3.5's does, a PIL image processor sized so a
picture is 16 to 64 image tokens, and a handful of generated pictures. For tests, benchmarks and
`demo --quick --multimodal`; weights are random.

The processor is not saved as a `Qwen3VLProcessor`: that class insists on a video processor, which
needs torchvision, and torchvision's wheels do not load beside the CPU torch here. The folder holds
what the processor is made of (the tokenizer, `preprocessor_config.json`), each loadable alone:
`load_image_processor` loads the image processor with the PIL backend (`Qwen2VLImageProcessorPil`),
and `image_token_count` says how many `<|image_pad|>` tokens the processor expands an image into.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftdeck.drafter.tiny import build_tokenizer
from draftdeck.drafter.tiny_targets import tiny_causal_lm

# Qwen3.5's vision special tokens, as its tokenizer names them: an image is rendered as
# <|vision_start|><|image_pad|><|vision_end|>, and the processor repeats <|image_pad|> once per merged
# patch of the image's grid
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD, VISION_PAD = (
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|vision_pad|>",
)  # fmt: skip
VISION_TOKENS = [VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD]

# Qwen3.5's chat template for content parts, cut to what the tiny world needs (no tools, no thinking):
# a string content as it is; a list of parts, each image part (`type: image`, an `image` or an
# `image_url` key) as the three vision tokens, each text part as its text
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# The vision tower of `tiny_causal_lm("qwen3_5_vision")`: 8-pixel patches, 2x2 of them merged into one
# image token, 2 frames a temporal patch (a picture is repeated to fill it), as Qwen3.5's are 16/2/2.
PATCH, MERGE, TEMPORAL = 8, 2, 2
# An image token covers (PATCH * MERGE)^2 = 256 pixels: pictures are resized to between 16 and 64 of them
MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS = 16, 64
PIXELS_PER_TOKEN = (PATCH * MERGE) ** 2


def preprocessor_config() -> dict[str, Any]:
    """The image processor's `preprocessor_config.json`: Qwen2-VL's processor (Qwen3.5 uses it) with the
    tiny tower's patch sizes and Qwen3.5's normalisation (mean and std 0.5)."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen3VLProcessor",
        "patch_size": PATCH,
        "merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "size": {
            "shortest_edge": MIN_IMAGE_TOKENS * PIXELS_PER_TOKEN,
            "longest_edge": MAX_IMAGE_TOKENS * PIXELS_PER_TOKEN,
        },
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "rescale_factor": 1 / 255,
    }


def write_tiny_vlm(folder: str | Path, seed: int = 0, *, vocab_size: int = 512) -> Path:
    """Write a tiny random Qwen3.5-style VLM to `folder` (config, weights, tokenizer with the vision
    tokens and a chat template rendering image parts, `preprocessor_config.json`), loadable offline by
    `Qwen3_5ForConditionalGeneration.from_pretrained` / `AutoModelForImageTextToText`. The tokenizer is
    the demo world's byte-level BPE (`vocab_size` pieces, trained on the demo conversations), plus
    Qwen's vision tokens. Deterministic given `seed`."""
    import torch
    from transformers import AutoTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer(folder, vocab_size=vocab_size, seed=seed, n_texts=500)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", *VISION_TOKENS]})
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(folder))
    model = tiny_causal_lm("qwen3_5_vision", vocab_size=len(tok), seed=seed)
    ids = {name: tok.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", IMAGE_PAD), ("video_token_id", VIDEO_PAD),
        ("vision_start_token_id", VISION_START), ("vision_end_token_id", VISION_END),
    )}  # fmt: skip
    for name, value in ids.items():
        setattr(model.config, name, value)
    text = model.config.get_text_config()
    text.eos_token_id = model.config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    text.pad_token_id = model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = text.eos_token_id
    model.generation_config.pad_token_id = text.pad_token_id
    with torch.no_grad():  # logit 0 among random ones: scarcely ever emitted, as a trained VLM never
        # emits them (an answer with an image token would have no picture for it)
        for token in VISION_TOKENS:
            model.lm_head.weight[tok.convert_tokens_to_ids(token)] = 0.0
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(), indent=2) + "\n")
    return folder


def load_image_processor(folder: str | Path) -> Any:
    """The image processor of a target folder, with the PIL backend (`Qwen2VLImageProcessorPil` for
    Qwen3.5): the torchvision one does not load beside a CPU torch."""
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(folder), backend="pil", local_files_only=True)


def image_token_count(image_grid_thw: Any, merge_size: int = MERGE) -> int:
    """How many image tokens an image of grid (t, h, w) patches becomes: merge_size^2 patches a token."""
    t, h, w = (int(v) for v in image_grid_thw)
    return t * h * w // (merge_size * merge_size)


# Colours and shapes the pictures are drawn from: distinct pictures, each a few shapes on a background
_COLOURS = [
    (220, 40, 40), (40, 160, 60), (40, 80, 220), (240, 200, 40), (150, 60, 200), (30, 30, 30),
    (250, 250, 250), (240, 130, 30),
]  # fmt: skip
_SIZES = [(64, 64), (96, 64), (64, 128), (128, 128), (112, 80), (80, 96)]


def write_tiny_images(folder: str | Path, n: int = 6, seed: int = 0) -> list[Path]:
    """`n` distinct PNG pictures in `folder` (`picture-<i>.png`), deterministic given `seed`: shapes in
    colours on a coloured background, at sizes from 64x64 to 128x128 (16 to 64 image tokens each)."""
    from PIL import Image, ImageDraw

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for i in range(n):
        width, height = _SIZES[(i + seed) % len(_SIZES)]
        background = _COLOURS[i % len(_COLOURS)]
        image = Image.new("RGB", (width, height), background)
        draw = ImageDraw.Draw(image)
        for _ in range(2 + i % 3):
            x0, y0 = rng.randrange(0, width // 2), rng.randrange(0, height // 2)
            box = (x0, y0, x0 + rng.randrange(8, width // 2), y0 + rng.randrange(8, height // 2))
            colour = rng.choice([c for c in _COLOURS if c != background])
            if rng.random() < 0.5:
                draw.ellipse(box, fill=colour)
            else:
                draw.rectangle(box, fill=colour)
        path = folder / f"picture-{i}.png"
        image.save(path, format="PNG")
        paths.append(path)
    return paths


@dataclass
class ImageRow:
    """A tokenized conversation with images, in the shard store's layout (draftdeck.shards.store):
    `ids` with each image's tokens expanded, `mask` 1 on the answer alone (0 on every image token),
    the `pictures` in order and their (t, h, w) `grids`."""

    ids: list[int]
    mask: list[int]
    pictures: list[Path]
    grids: list[tuple[int, int, int]]


def image_row(tok: Any, processor: Any, question: str, answer: str, pictures: list[Path]) -> ImageRow:
    """One user turn (`pictures` then `question`) and the assistant's `answer`, rendered with the chat
    template and each `<|image_pad|>` expanded to its picture's token count, as a processor does; the
    answer and its end token trained. For tests and benchmarks until tokenize's processor path is used."""
    from PIL import Image

    grids: list[tuple[int, int, int]] = []
    for path in pictures:
        with Image.open(path) as image:
            grid = processor([image.convert("RGB")], return_tensors="pt")["image_grid_thw"][0]
        grids.append((int(grid[0]), int(grid[1]), int(grid[2])))
    parts: Any = [*({"type": "image"} for _ in pictures), {"type": "text", "text": question}]
    user = [{"role": "user", "content": parts}]
    prompt = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template([*user, {"role": "assistant", "content": answer}], tokenize=False)
    for grid in grids:  # one placeholder at a time, in order: each its own picture's count
        prompt = prompt.replace(IMAGE_PAD, "\0" * image_token_count(grid), 1)
        whole = whole.replace(IMAGE_PAD, "\0" * image_token_count(grid), 1)
    prompt_ids = tok(prompt.replace("\0", IMAGE_PAD))["input_ids"]
    ids = tok(whole.replace("\0", IMAGE_PAD))["input_ids"]
    if ids[: len(prompt_ids)] != prompt_ids:
        raise ValueError("the prompt's tokens are not a prefix of the conversation's")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    trained = ids[len(prompt_ids) :].index(end) + 1 + len(prompt_ids)  # the answer and its end token
    mask = [0] * len(prompt_ids) + [1] * (trained - len(prompt_ids)) + [0] * (len(ids) - trained)
    return ImageRow(ids, mask, list(pictures), grids)


def write_image_dataset(out: Path, rows: list[ImageRow], target: Path, source: str = "images.jsonl") -> Path:
    """A shard folder of `rows` (text rows: no pictures) with the image columns, each picture stored once
    under `images/` by its sha256 and listed in the manifest, and the target tokenizer's fingerprint."""
    import numpy as np
    from transformers import AutoTokenizer

    from draftdeck.chat.render import tokenizer_fingerprint
    from draftdeck.formats.images import check_bytes, store_checked
    from draftdeck.shards.manifest import ImageFile, Manifest, TokenizerRef
    from draftdeck.shards.store import IMAGES_DIR, ShardRow, ShardWriter, write_metadata

    out.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(out, shard_rows=64)
    stored: dict[str, ImageFile] = {}
    for i, row in enumerate(rows):
        names = []
        for path in row.pictures:
            checked = check_bytes(Path(path).read_bytes(), where=str(path))
            name = store_checked(checked, out / IMAGES_DIR)
            stored[name] = ImageFile(name, len(checked.data), checked.sha256)
            names.append(name)
        flat = [v for grid in row.grids for v in grid]
        writer.add(ShardRow(np.asarray(row.ids, np.int32), np.asarray(row.mask, np.uint8), source, i, -1,
                            False, images=names, image_grid_thw=flat))  # fmt: skip
    shards = writer.close()
    template = AutoTokenizer.from_pretrained(target).chat_template or ""
    tokenizer = TokenizerRef(path=str(target), fingerprint=tokenizer_fingerprint(target, template, {}),
                             chat_template=template)  # fmt: skip
    write_metadata(out, Manifest(shards=shards, tokenizer=tokenizer, parameters={"template_kwargs": {}},
                                 images=sorted(stored.values(), key=lambda f: f.filename)))  # fmt: skip
    return out


def write_answered_conversations(
    folder: Path, pictures: list[Path], n: int, out: Path, *, max_new: int = 32, seed: int = 0
) -> dict[str, int]:
    """`n` conversations answered greedily by the VLM in `folder` (its tower reading each prompt's
    picture), written to `out` as JSONL in the shapes users bring images in, by turns: OpenAI
    `image_url` parts (the file's path), LLaMA-Factory `<image>` placeholders with an `images` list
    relative to `out`, and text alone. Returns the rows of each shape."""
    import os

    from transformers import AutoTokenizer

    from draftdeck.drafter.model.target import Target
    from draftdeck.drafter.model.vision import ImageRows
    from draftdeck.drafter.train.truth import target_answers

    tok, processor = AutoTokenizer.from_pretrained(folder), load_image_processor(folder)
    rng = random.Random(seed)
    asked: list[tuple[str, list[Path]]] = []
    for i in range(n):
        shown = [] if i % 3 == 2 else [pictures[rng.randrange(len(pictures))]]
        what = rng.choice(["shapes", "colours", "corners", "background", "largest shape"])
        asked.append(
            (f"Tell me about the {what} in picture {i}." if shown else f"Tell me a story, {i}.", shown)
        )
    rows = [image_row(tok, processor, question, "-", shown) for question, shown in asked]
    prompts = [r.ids[: r.mask.index(1)] for r in rows]
    target = Target.load(folder, vision=True)
    target.attach_images(ImageRows(int(target.model.config.image_token_id)))
    images = [list(zip(r.pictures, r.grids, strict=True)) for r in rows]
    answers = target_answers(target, prompts, [max_new] * n, images=images)
    counts = {"image_url": 0, "<image>": 0, "text": 0}
    lines = []
    for i, ((question, shown), (ids, _)) in enumerate(zip(asked, answers, strict=True)):
        answer = str(tok.decode(ids[len(prompts[i]) :].tolist(), skip_special_tokens=True)).strip() or "-"
        row: dict[str, Any]
        if not shown:
            row, shape = {"messages": [{"role": "user", "content": question}]}, "text"
        elif i % 3 == 0:
            parts = [
                {"type": "image_url", "image_url": {"url": str(shown[0])}},
                {"type": "text", "text": question},
            ]
            row, shape = {"messages": [{"role": "user", "content": parts}]}, "image_url"
        else:
            relative = os.path.relpath(shown[0], out.parent)
            row = {"messages": [{"role": "user", "content": f"<image>{question}"}], "images": [relative]}
            shape = "<image>"
        row["messages"].append({"role": "assistant", "content": answer})
        lines.append(json.dumps(row))
        counts[shape] += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return counts
