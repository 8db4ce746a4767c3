"""The tiny VLM world loads as a VLM target does: the model class from the folder, the PIL image
processor from its preprocessor_config.json, the chat template rendering image parts with Qwen's vision
tokens; a picture's image tokens match its grid, and a forward with its pixels runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image

from draftdeck.drafter.tiny_vlm import (
    IMAGE_PAD,
    MAX_IMAGE_TOKENS,
    MIN_IMAGE_TOKENS,
    VISION_END,
    VISION_START,
    image_token_count,
    load_image_processor,
)  # fmt: skip


def test_processor_and_template(tiny_vlm: Path, pictures: list[Path]) -> None:
    from transformers import AutoTokenizer

    processor = load_image_processor(tiny_vlm)
    assert type(processor).__name__ == "Qwen2VLImageProcessorPil"
    images = [Image.open(p) for p in pictures]
    out = processor(images, return_tensors="pt")
    grids = out["image_grid_thw"]
    counts = [image_token_count(g) for g in grids]
    assert all(MIN_IMAGE_TOKENS <= c <= MAX_IMAGE_TOKENS for c in counts), counts
    assert len(set(counts)) > 1  # pictures of several sizes: grids differ
    assert out["pixel_values"].shape[0] == int(grids.prod(-1).sum())  # a row of pixels a patch
    assert len({p.read_bytes() for p in pictures}) == len(pictures)  # distinct pictures

    tok = AutoTokenizer.from_pretrained(tiny_vlm)
    parts: Any = [{"type": "image"}, {"type": "text", "text": "What is drawn?"}]  # content parts
    text = tok.apply_chat_template([{"role": "user", "content": parts}], tokenize=False)
    assert f"{VISION_START}{IMAGE_PAD}{VISION_END}What is drawn?" in text
    ids = tok(text)["input_ids"]
    for token in (VISION_START, IMAGE_PAD, VISION_END):
        assert ids.count(tok.convert_tokens_to_ids(token)) == 1  # each one special token, not split


def test_forward_with_pixels(tiny_vlm: Path, pictures: list[Path]) -> None:
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm).eval()
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"
    tok = AutoTokenizer.from_pretrained(tiny_vlm)
    out = load_image_processor(tiny_vlm)([Image.open(pictures[1])], return_tensors="pt")
    n = image_token_count(out["image_grid_thw"][0])
    text = f"<|im_start|>user\n{VISION_START}{IMAGE_PAD * n}{VISION_END}What is drawn?<|im_end|>\n"
    ids = torch.tensor([tok(text)["input_ids"]])
    image = ids == model.config.image_token_id
    assert int(image.sum()) == n
    with torch.no_grad():
        seen = model(input_ids=ids, pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"],
                     mm_token_type_ids=image.int()).logits  # fmt: skip
        unseen = model(input_ids=ids).logits  # the image tokens' own embedding, not the picture
    assert seen.shape == (1, ids.shape[1], len(tok))
    assert not torch.allclose(seen[0, -1], unseen[0, -1])  # the picture reached the text after it
    # a picture with a grid of n tokens: one image token too few is refused by the model
    short = ids[image.logical_not() | (image.cumsum(-1) > 1)][None]
    try:
        model(input_ids=short, pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"],
              mm_token_type_ids=(short == model.config.image_token_id).int())  # fmt: skip
    except ValueError as e:
        assert "do not match" in str(e)
    else:
        raise AssertionError("a grid of n tokens fed n - 1 image tokens ran")
