"""The options of an MTP run: the steps the target's MTP layer is unrolled for, and their weights.
Defined once: the train job's parameters, its form, CLI and API take them from here
(draftdeck.drafter.kinds.Options)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from draftdeck.drafter.kinds.base import KindOptions

DEFAULT_MTP_STEPS = 3  # speculators' num_speculative_steps
DEFAULT_MTP_BETA = 0.6  # speculators' step_weight_beta (FastMTP)


class MTPOptions(KindOptions):
    title: ClassVar[str] = "MTP"

    mtp_steps: int = Field(
        DEFAULT_MTP_STEPS,
        ge=1,
        le=32,
        description="MTP: steps the target's MTP layer is unrolled for in training, each reading the last"
        " one's output (FastMTP; the chain's drafts trained, vLLM's num_speculative_tokens)",
    )
    mtp_step_beta: float = Field(
        DEFAULT_MTP_BETA,
        gt=0,
        le=1,
        description="MTP: step k's loss weight is beta^k / sum_j beta^j (speculators' compute_step_weights,"
        " FastMTP eq. 2)",
    )
