"""A vision-language target's image inputs (issue 55): the pixels, grids and token types the model's own
forward takes beside the ids, for rows whose ids hold expanded image tokens.

Every caller of the target (the trainer's kinds, the truth checks, the walk, the eval's decoder) passes
it ids alone. A caller that knows which rows it passes (the target's own answers, the eval's prompts)
gives their images (`Target.vision_inputs(..., images=...)`, `ImageRows.bind`); elsewhere the target
looks a sequence's images up by its tokens (`ImageRows`: the sha256 of the whole sequence). The data's
rows are recorded when they are read, whole and as training cuts them, and so are the prompts of their
trained turns; a prompt that two rows share with different pictures (the same question about two
pictures of one size) is recorded as ambiguous, and is only decoded where the caller says which row it
is. Two whole rows with the same tokens and different pictures are refused before any step
(`ImageRowConflict`).

A sequence holds a row's leading images: as many as its image tokens cover (a prompt before a later
turn's picture holds the earlier ones only).

Positions: the model computes its M-RoPE positions from the ids, the grids and the token types
(`get_rope_index`) when it is given no position ids, so a teacher-forced forward passes none. A decoder
that runs the target over a cache passes them itself (`cached_forward_inputs`).
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


def sequence_key(ids: Sequence[int] | np.ndarray) -> bytes:
    """A sequence's key: sha256 of its ids."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).digest()


class ImageRows:
    """The images of sequences with images, by `sequence_key` (None: ambiguous, two rows' pictures)."""

    def __init__(self, image_token_id: int):
        self.image_token_id = image_token_id
        self.by_key: dict[bytes, tuple[RowImage, ...] | None] = {}
        self.where: dict[bytes, str] = {}

    def __len__(self) -> int:
        return len(self.by_key)

    def add(
        self, ids: Sequence[int] | np.ndarray, images: Sequence[RowImage], where: str, *, strict: bool
    ) -> None:
        """Record a sequence's images (`where`: the row, for a refusal). `strict` (a whole row): another
        row of the same tokens with other images is refused; else (a prompt two rows share) the
        sequence becomes ambiguous."""
        key, images = sequence_key(ids), tuple(images)
        if key in self.by_key and self.by_key[key] != images:
            if strict:
                raise ImageRowConflict(
                    f"{where} and {self.where[key]}: the same tokens but different images; the target's"
                    " inputs could not be told apart: remove one of them"
                )
            self.by_key[key] = None
            return
        self.by_key[key] = images
        self.where.setdefault(key, where)

    def bind(self, ids: Sequence[int] | np.ndarray, images: Sequence[RowImage]) -> None:
        """Say which images a sequence holds, whatever was recorded for it (a caller that knows the row:
        the eval's prompt, the target's own answer to it)."""
        self.by_key[sequence_key(ids)] = tuple(images)

    def lookup(self, ids: Sequence[int] | np.ndarray) -> tuple[RowImage, ...]:
        """A sequence's images (none: it has no image token). ImageInputError when it is not a recorded
        sequence or an ambiguous one."""
        if self.image_token_id not in np.asarray(ids):
            return ()
        key = sequence_key(ids)
        if key not in self.by_key:
            raise ImageInputError(
                "a sequence with image tokens is not one of the data's rows or prompts: its images are"
                " unknown"
            )
        found = self.by_key[key]
        if found is None:
            raise ImageInputError(
                f"{self.where[key]}: its prompt's tokens are another row's with other pictures: which row's"
                " pictures it shows is not known from its tokens"
            )
        return found


class VisionInputs:
    """The image processor of a target folder and the rows' images: a batch's model inputs."""

    def __init__(self, folder: Path, config: Any, rows: ImageRows, *, cached_bytes: int = 2**30):
        self.folder = folder
        self.rows = rows
        self.image_token_id = int(config.image_token_id)
        self.merge = int(config.vision_config.spatial_merge_size)
        self._processor: Any = None
        self._pixels: OrderedDict[Path, torch.Tensor] = OrderedDict()
        # the processed pictures kept for the next forward that shows them, up to `cached_bytes` (a
        # Qwen3.5 picture of 1,280 image tokens is ~31 MB of float32 patches)
        self._cached_bytes = cached_bytes
        self._held = 0

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
            self._held += got.numel() * got.element_size()
            while self._held > self._cached_bytes and len(self._pixels) > 1:
                _, dropped = self._pixels.popitem(last=False)
                self._held -= dropped.numel() * dropped.element_size()
        else:
            self._pixels.move_to_end(path)
        return got

    def tokens(self, grid: Grid) -> int:
        t, h, w = grid
        return t * h * w // (self.merge * self.merge)

    def leading(self, have: int, images: Sequence[RowImage]) -> tuple[RowImage, ...]:
        """The leading `images` whose tokens make `have` image tokens (ImageInputError if none do)."""
        total = 0
        for k, (_, grid) in enumerate(images):
            if total == have:
                return tuple(images[:k])
            total += self.tokens(grid)
        if total == have:
            return tuple(images)
        raise ImageInputError(
            f"a row has {have} image tokens; its {len(images)} images' grids do not make them"
        )

    def batch(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
        images: Sequence[Sequence[RowImage]] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """The model's image inputs for (bsz, T) ids (padding where `attention_mask` is 0): pixel values
        and grids of every row's images in order, and the token types; {} for a batch without images.
        `images`: each row's images, where the caller knows them (else looked up by the row's tokens)."""
        image = input_ids == self.image_token_id
        if not bool(image.any()):
            return {}
        pixels, grids = [], []
        for r in range(input_ids.shape[0]):
            row = input_ids[r] if attention_mask is None else input_ids[r][attention_mask[r].bool()]
            have = int((row == self.image_token_id).sum())
            found = self.rows.lookup(row.tolist()) if images is None else images[r]
            for path, grid in self.leading(have, found):
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
    model: Any, vision: VisionInputs | None, input_ids: torch.Tensor, start: int, cache: Any,
) -> dict[str, Any]:  # fmt: skip
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
