"""Training on rows with images (issue 55): the target's vision tower reads them.

A dataset with images (the `images` and `image_grid_thw` columns, draftdeck.shards.store) is trained
against the whole vision-language model: its frozen vision tower encodes each row's pictures, the model
injects those features at the row's image tokens and computes its M-RoPE positions, and the drafter
reads the hidden states at every position as for text. The loss mask is the data's: 0 on image tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftdeck.causal_lm import read_model_config
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.model.vision import ImageRows
from draftdeck.drafter.train.params import TrainParams
from draftdeck.errors import UsageError


def image_token_id(folder: Path | None) -> int | None:
    """The image token of a target with a vision tower (its config.json's `image_token_id`), else None."""
    if folder is None:
        return None
    raw = read_model_config(folder)
    value = raw.get("image_token_id") if "vision_config" in raw else None
    return int(value) if value is not None else None


def with_vision(
    params: TrainParams, rows: ImageRows, device: torch.device, dtype: torch.dtype | None
) -> Target:
    """The target loaded whole (vision tower and language model, all frozen) for data with images: each
    forward injects the tower's features at the image tokens and takes the model's M-RoPE positions."""
    if params.hidden_states is not None:
        raise UsageError(
            "the data has images: a hidden-state cache holds no image features yet;"
            " train without hidden_states"
        )
    target = Target.load(params.target, device=device, dtype=dtype, vision=True)
    target.attach_images(rows)
    return target
