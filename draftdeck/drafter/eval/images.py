"""Evaluating on prompts with images (issue 55): a tokenized dataset with image columns is decoded
against the whole vision-language target (its frozen tower encodes each prompt's pictures at the
prefill; every later position continues from the prompt's M-RoPE positions, shifted by its rope delta),
and the drafter's counts are kept apart for prompts with images and prompts of text alone: a drafter
trained on text is served on both, and its acceptance on each is what tells whether it needs images.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftdeck.drafter.eval.spec_decode import DecodeStats, Generation
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.model.vision import RowImage
from draftdeck.shards.store import MANIFEST, ShardDataset, is_multimodal

if TYPE_CHECKING:
    from draftdeck.drafter.train.data import TrainData


def dataset_images(inputs: list[str], target: str | Path) -> TrainData | None:
    """An eval dataset folder's rows, their images recorded (None: a prompt file, or a dataset without
    images). The target must have a vision tower to read them (DataError otherwise)."""
    from draftdeck.drafter.train.data import TrainData
    from draftdeck.drafter.train.images import image_token_id

    if not inputs or not (Path(inputs[0]) / MANIFEST).is_file():
        return None
    if not is_multimodal(ShardDataset(inputs[0]).schema):
        return None
    data = TrainData(inputs[:1], heldout_fraction=0.0, image_token_id=image_token_id(Path(target)))
    return data if data.image_rows is not None else None


class PromptImages:
    """Which pictures each decoded prompt shows: its dataset row's, said to the target before it is
    decoded (two rows may share a prompt's tokens with other pictures), and again for the prompt with
    the target's output, which the walk runs."""

    def __init__(self, target: Target, data: TrainData | None):
        self.rows = target.vision.rows if target.vision is not None and data is not None else None
        self.data = data

    def of(self, row: int | None) -> tuple[RowImage, ...]:
        if self.data is None or row is None:
            return ()
        return self.data.images_by_row.get((0, row), ())

    def bind(self, ids: list[int], row: int | None) -> None:
        shown = self.of(row)
        if self.rows is not None and shown:
            self.rows.bind(ids, shown)


class ByModality:
    """The drafter's decoding counts on prompts with images and on prompts of text alone."""

    def __init__(self, block: int, image_token_id: int):
        self.image_token_id = image_token_id
        self.stats = {"image": DecodeStats(block), "text": DecodeStats(block)}

    def add(self, prompt_ids: list[int], gen: Generation) -> None:
        self.stats["image" if self.image_token_id in prompt_ids else "text"].add(gen)

    def to_json(self) -> dict[str, Any]:
        """Per modality: prompts, accepted drafts, verify steps, tokens they produced, and tau incl. bonus
        = 1 + accepted / steps (only to be shown)."""
        return {
            name: {"prompts": st.responses, "accepted": st.accepted, "steps": st.steps,
                   "produced": st.produced, "tau_incl_bonus": st.tau_pooled,
                   "tokens_per_step": st.tokens_per_step}
            for name, st in self.stats.items()
        }  # fmt: skip
