"""`RunRecord`: what defines a training run and where it got to (the run folder's run.json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunRecord:
    """What defines a run (saved as <out>/run.json), and where it got to."""

    inputs: list[str]
    manifest_sha256: list[str]
    target: str
    drafter: dict[str, Any]  # DrafterConfig.to_dict(): block size, layers, layer ids, mask id + source
    loss: str
    gamma: float
    anchors_per_seq: int
    seq_length: int | None
    lr_schedule: dict[str, Any]
    seed: int
    world_size: int
    global_batch: int
    data: dict[str, Any]
    steps_done: int = 0
    total_steps: int = 0
    best_step: int | None = None
    checkpoints: list[str] = field(default_factory=list)
    # the pre-flight's findings (draftdeck.drafter.train.preflight.Verdict.to_dict): provenance,
    # agreement, alert
    truth: dict[str, Any] = field(default_factory=dict)
    # the memory estimate before step 1 (draftdeck.drafter.train.memory.MemoryEstimate.to_dict)
    memory: dict[str, Any] = field(default_factory=dict)
    # how the ranks held the drafter and why (draftdeck.drafter.train.sharding.choose_sharding)
    sharding: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
