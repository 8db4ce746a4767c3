"""The options of an EAGLE-3 drafter: training-time test, its step decay, the draft vocabulary and the
tapped hidden states. Defined once: the train job's parameters, its form, CLI and API take them from here
(draftdeck.drafter.kinds.Options)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from draftdeck.drafter.kinds.base import KindOptions

DEFAULT_DRAFT_VOCAB = 32000  # EAGLE's, SpecForge's and speculators' default


class Eagle3Options(KindOptions):
    title: ClassVar[str] = "EAGLE-3"

    ttt_steps: int = Field(
        7, ge=1, le=32, description="EAGLE-3: TTT steps (training time test: the chain's drafts trained)"
    )
    step_decay: float = Field(
        0.8, gt=0, le=1, description="EAGLE-3: weight of TTT step k is step_decay^k (EAGLE, SpecForge: 0.8)"
    )


class Eagle3VocabOptions(KindOptions):
    """The draft vocabulary and the tapped layers: EAGLE-3's, and P-EAGLE's (the same layer over them)."""

    title: ClassVar[str] = "EAGLE-3"
    input_paths: ClassVar[tuple[str, ...]] = ("draft_vocab",)

    draft_vocab_size: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="EAGLE-3: draft vocabulary, the most frequent trained tokens of the training split"
        f" (default {DEFAULT_DRAFT_VOCAB:,}, at most the target's vocabulary; with draft_vocab, the file's)",
    )
    draft_vocab: str | None = Field(
        None,
        description="EAGLE-3: the draft vocabulary from a file, not counted: draftdeck vocab's .npz or .json,"
        " SpecForge's vocab_mapping.pt, or a checkpoint's model.safetensors (one mapping across runs)",
    )
    eagle3_layer_ids: list[int] | None = Field(
        None,
        description="EAGLE-3: the three tapped hidden_states indices, HF's (= vLLM's) convention"
        " (default: 2, L//2, L-3 as the field)",
    )
