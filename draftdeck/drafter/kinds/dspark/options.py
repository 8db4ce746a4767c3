"""The options of a DSpark drafter beside the DFlash family's (its heads, drafting from the anchor, a
warm start). Defined once: the train job's parameters, its form, CLI and API take them from here
(draftdeck.drafter.kinds.Options)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from draftdeck.drafter.kinds.base import KindOptions


class DSparkOptions(KindOptions):
    title: ClassVar[str] = "DSpark"
    input_paths: ClassVar[tuple[str, ...]] = ("init_from",)

    markov_rank: int = Field(
        256, ge=0, le=4096, description="DSpark: rank of the Markov head's logit bias (0: no Markov head)"
    )
    markov_head: Literal["vanilla", "gated", "rnn"] = Field(
        "vanilla",
        description="DSpark: the Markov head: vanilla (the previous token's bias), gated (gated by the"
        " slot's hidden state) or rnn (a state carried over the block's slots)",
    )
    confidence_head: bool = Field(
        True, description="DSpark: a head predicting each slot's acceptance (BCE against sum min(p, q))"
    )
    confidence_weight: float = Field(
        1.0, ge=0, le=100, description="DSpark: weight of the confidence head's BCE beside the token loss"
    )
    sample_from_anchor: bool = Field(
        True,
        description="DSpark: the block drafts from the anchor (B tokens a block; DeepSpec's and"
        " speculators' default) rather than after it (B - 1, DFlash's convention)",
    )
    init_from: str | None = Field(
        None,
        description="DSpark: warm start from a DFlash checkpoint or run of the same target (its layers; the"
        " heads start fresh)",
    )
