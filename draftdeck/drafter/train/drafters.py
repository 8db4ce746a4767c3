"""What the trainer asks of a drafter kind (`TrainParams.drafter`, draftdeck.drafter.kinds): the model
and how ranks hold it, a micro-batch, the loss's weight sum, forward and backward, the held-out pass,
the checkpoint's config files, and what a resumed checkpoint must agree with (`TrainKind`, each kind's
train.py). Everything else (data order, ranks, optimizer, counts, truth checks, reporting) is the
trainer's, the same for every kind.

Both kinds count in `Counts` slots: DFlash's block slot k drafts the k-th token after the anchor;
EAGLE-3's TTT step k is slot k + 1 (the (k + 1)-th draft of the chain), so every chart, alert and
walk reads them alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.model.attention import Backend
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.data import TrainData
from draftdeck.drafter.train.memory import MemoryEstimate, Shapes
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.ranks import Ranks
from draftdeck.drafter.train.sharding import Sharding
from draftdeck.drafter.train.truth import Batch

DRAFTER_JSON = "drafter.json"


@dataclass
class MicroBatch:
    """One micro-batch on this rank: (bsz, T) ids, attention and loss masks; DFlash's sampled anchors
    (bsz, A) and which are real (EAGLE-3 trains at every position: none; P-EAGLE's `anchors` are the
    chains COD sampling keeps at each depth, (bsz, K, T) bool)."""

    ids: torch.Tensor
    att: torch.Tensor
    lm: torch.Tensor
    anchors: torch.Tensor | None = None
    valid: torch.Tensor | None = None


class TrainKind(Protocol):
    name: str
    shards_state: bool  # under fsdp, the drafter's weights, gradients and AdamW state are split
    slots: int  # `Counts` slots: 1 + the drafts a step proposes at most
    layer_ids: list[int]  # the target layers read (`Target`'s ids: hidden_states[i + 1])

    @property
    def cfg(self) -> Any: ...  # the drafter's config (its kind's)
    @property
    def model(self) -> nn.Module: ...

    def fresh(self) -> nn.Module: ...  # an unsharded drafter of the same config (the held-out copy)
    def describe(self) -> dict[str, Any]: ...
    def summary(self) -> str: ...  # the job log's line: what the run trains
    def shard(self, strategy: Sharding, why: str, device: torch.device, world: int) -> str: ...
    def loss_formula(self) -> str: ...
    def estimate(
        self, shapes: Shapes, target_config: object, *, held: int, capacity: int | None
    ) -> MemoryEstimate:
        """The run's peak memory from its shapes (draftdeck.drafter.train.memory)."""

    def micro_batch(
        self, examples: list[Any], generators: list[torch.Generator], pad_id: int, device: torch.device
    ) -> MicroBatch: ...
    def align(self, micro: list[MicroBatch], ranks: Ranks) -> list[MicroBatch]: ...
    def weight_sum(self, m: MicroBatch) -> float: ...
    def backward(
        self, model: nn.Module, target: Target, m: MicroBatch, normalizer: float, attention: Backend
    ) -> Counts: ...
    def reduce_gradients(self, ranks: Ranks) -> None: ...
    def heldout(
        self, model: nn.Module, target: Target, batches: list[Batch], sources: Sequence[Sequence[str]],
        judge: bool, sample: bool, attention: Backend,
    ) -> tuple[Counts, dict[str, Counts]]: ...  # fmt: skip
    def config_files(self) -> dict[str, bytes]: ...
    def check_resume(self, state: dict[str, torch.Tensor]) -> None: ...


def drafter_kind(params: TrainParams, target: Target, data: TrainData) -> TrainKind:
    """The trainer's part of the run's drafter kind (draftdeck.drafter.kinds)."""
    return get_kind(params.drafter).trainer(params, target, data)


def config_json(d: dict[str, Any]) -> bytes:
    """A checkpoint's JSON file."""
    return json.dumps(d, indent=2).encode()
