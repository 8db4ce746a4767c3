"""A vision-language target's image inputs (issue 55): the pixels, grids and token types the model's own
forward takes beside the ids, for rows whose ids hold expanded image tokens.

Every caller of the target (the trainer's kinds, the truth checks, the walk, the eval's decoder) passes
it ids alone. Rather than thread images through each of them, the target looks each row's images up by
its tokens: `ImageRows` keys a row by the sha256 of its ids up to and including its last image token.
Any sequence that holds all of a row's images shares that key: the whole row, its prompt, the prompt
with the target's own answer, the prompt with drafts. Two rows whose tokens agree up to their last
image but whose pictures differ cannot be told apart by their tokens; they are refused when the data is
read (`ImageRowConflict`), before any step.

Positions: the model computes its M-RoPE positions from the ids, the grids and the token types
(`get_rope_index`) when it is given no position ids, so a teacher-forced forward passes none. A decoder
that runs the target over a cache passes them itself (`mrope_positions`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftdeck.errors import UsageError

Grid = tuple[int, int, int]  # an image's (t, h, w) patch grid
RowImage = tuple[Path, Grid]  # a stored image file and its grid


class ImageRowConflict(UsageError):
    """Two rows share their tokens up to their last image token but hold different images."""


class ImageInputError(UsageError):
    """A row's image tokens cannot be matched with its images."""


def image_prefix_key(ids: Sequence[int] | np.ndarray, image_token_id: int) -> bytes | None:
    """The key of a sequence's images: sha256 of its ids up to its last image token (None: it has none)."""
    arr = np.asarray(ids, dtype=np.int64)
    where = np.flatnonzero(arr == image_token_id)
    if not where.size:
        return None
    return hashlib.sha256(arr[: int(where[-1]) + 1].tobytes()).digest()


class ImageRows:
    """The images of each row with images, by `image_prefix_key`."""

    def __init__(self, image_token_id: int):
        self.image_token_id = image_token_id
        self.by_key: dict[bytes, tuple[RowImage, ...]] = {}
        self.where: dict[bytes, str] = {}

    def __len__(self) -> int:
        return len(self.by_key)

    def add(self, ids: Sequence[int] | np.ndarray, images: Sequence[RowImage], where: str) -> None:
        """Record a row's images (`where`: the row, for the refusal of a conflicting one)."""
        key = image_prefix_key(ids, self.image_token_id)
        if key is None:
            raise ImageInputError(f"{where}: {len(images)} images but no image token in its ids")
        have = self.by_key.get(key)
        if have is not None and have != tuple(images):
            raise ImageRowConflict(
                f"{where} and {self.where[key]}: the same tokens up to their last image but different "
                "images; the target's inputs could not be told apart: remove one of them"
            )
        self.by_key[key] = tuple(images)
        self.where.setdefault(key, where)

    def lookup(self, ids: Sequence[int] | np.ndarray) -> tuple[RowImage, ...]:
        """A sequence's images (none: it has no image token). ImageInputError when it has image
        tokens but no row of the data starts like it."""
        key = image_prefix_key(ids, self.image_token_id)
        if key is None:
            return ()
        found = self.by_key.get(key)
        if found is None:
            raise ImageInputError(
                "a sequence with image tokens is not the start of any row of the data read: its images are "
                "unknown (cut inside an image by seq_length?)"
            )
        return found


class VisionInputs:
    """The image processor of a target folder and the rows' images: a batch's model inputs."""

    def __init__(self, folder: Path, config: Any, rows: ImageRows, *, cached: int = 256):
        self.folder = folder
        self.rows = rows
        self.image_token_id = int(config.image_token_id)
        self.merge = int(config.vision_config.spatial_merge_size)
        self._processor: Any = None
        self._pixels: OrderedDict[Path, torch.Tensor] = OrderedDict()
        self._cached = cached

    @property
    def processor(self) -> Any:
        """The folder's image processor, PIL backend (torchvision's does not load beside a CPU torch)."""
        if self._processor is None:
            from transformers import AutoImageProcessor

            try:
                self._processor = AutoImageProcessor.from_pretrained(
                    str(self.folder), backend="pil", local_files_only=True
                )
            except (OSError, ValueError) as e:
                raise UsageError(f"{self.folder}: cannot load the target's image processor: {e}") from e
        return self._processor

    def pixels(self, path: Path, grid: Grid) -> torch.Tensor:
        """An image's patches (t * h * w, C * temporal * patch^2), as the processor makes them; its grid
        must be the one the data was tokenized with."""
        got = self._pixels.get(path)
        if got is None:
            from PIL import Image

            with Image.open(path) as image:
                out = self.processor([image.convert("RGB")], return_tensors="pt")
            made = tuple(int(v) for v in out["image_grid_thw"][0])
            if made != tuple(grid):
                raise ImageInputError(
                    f"{path}: the target's image processor gives grid {made}, the data says {tuple(grid)}: "
                    "tokenize the data with the target's processor"
                )
            got = out["pixel_values"]
            self._pixels[path] = got
            if len(self._pixels) > self._cached:
                self._pixels.popitem(last=False)
        else:
            self._pixels.move_to_end(path)
        return got

    def tokens(self, grid: Grid) -> int:
        t, h, w = grid
        return t * h * w // (self.merge * self.merge)

    def batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> dict[str, Any]:
        """The model's image inputs for (bsz, T) ids (padding where `attention_mask` is 0): pixel values
        and grids of every row's images in order, and the token types; {} for a batch without images."""
        image = input_ids == self.image_token_id
        if not bool(image.any()):
            return {}
        pixels, grids = [], []
        for r in range(input_ids.shape[0]):
            row = input_ids[r] if attention_mask is None else input_ids[r][attention_mask[r].bool()]
            found = self.rows.lookup(row.tolist())
            have = int((row == self.image_token_id).sum())
            want = sum(self.tokens(grid) for _, grid in found)
            if have != want:
                raise ImageInputError(
                    f"a row has {have} image tokens but its {len(found)} images' grids make {want}"
                )
            for path, grid in found:
                pixels.append(self.pixels(path, grid))
                grids.append(grid)
        device = input_ids.device
        return {
            "pixel_values": torch.cat(pixels).to(device),
            "image_grid_thw": torch.tensor(grids, dtype=torch.long, device=device),
            "mm_token_type_ids": image.int(),
        }


def mrope_positions(model: Any, input_ids: torch.Tensor, inputs: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """A prompt's positions as the model computes them (`get_rope_index`), with the sequence index in
    front (the row the causal mask reads): (4, 1, T), and the rope delta the positions after the prompt
    are shifted by (last position + 1 - length: negative after an image, whose tokens share positions)."""
    inner = model.model
    positions, delta = inner.get_rope_index(
        input_ids, mm_token_type_ids=inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"]
    )
    index = torch.arange(input_ids.shape[1], device=input_ids.device).view(1, 1, -1)
    return torch.cat([index, positions]), int(delta.reshape(-1)[0])


def shifted_positions(start: int, n: int, delta: int, device: torch.device) -> torch.Tensor:
    """Positions of `n` text tokens at sequence index `start`.. after a prompt with images: (4, 1, n), the
    sequence index and three M-RoPE rows, each the index plus `delta`, as the model continues them."""
    index = torch.arange(start, start + n, device=device).view(1, 1, -1)
    return torch.cat([index, (index + delta).expand(3, 1, -1)])


ROPE_DELTA = "draftdeck_rope_delta"  # the attribute of a decoding cache holding its prompt's rope delta


def cached_forward_inputs(
    model: Any, vision: VisionInputs | None, input_ids: torch.Tensor, start: int, cache: Any
) -> dict[str, Any]:
    """The position ids (and, for a prompt with images, the image inputs) of a forward of (1, n) ids at
    sequence index `start`.. over a decoding `cache`, as the model's own generation computes them: a
    prompt with images (start 0) takes its M-RoPE positions and pixels, and the cache keeps the prompt's
    rope delta, by which every later position is shifted; a text prompt's positions are the index."""
    n, device = input_ids.shape[1], input_ids.device
    if vision is None:
        return {"position_ids": torch.arange(start, start + n, device=device)[None]}
    if start == 0:
        inputs = vision.batch(input_ids, None)
        if inputs:
            positions, delta = mrope_positions(model, input_ids, inputs)
            setattr(cache, ROPE_DELTA, delta)
            return {"position_ids": positions, **inputs}
        setattr(cache, ROPE_DELTA, 0)
    return {"position_ids": shifted_positions(start, n, getattr(cache, ROPE_DELTA, 0), device)}
