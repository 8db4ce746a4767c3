"""`RunRecord`: what defines a training run and where it got to (the run folder's run.json)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from draftdeck.errors import UsageError

# what a resumed run must share with the run its folder holds
DEFINING = ("drafter", "seed", "gamma", "anchors_per_seq", "seq_length", "global_batch", "manifest_sha256")
# what the drafter's record says of the data rather than of the drafter: an EAGLE-3 draft vocabulary's
# coverage and source (the mapping itself is checked exactly on resume, `Eagle3Kind.check_resume`)
MEASURED = ("draft_vocab_coverage", "draft_vocab_from")


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
    # what this start ran with: versions, git commit, command line or parameters, device, world size
    # (draftdeck.run_provenance.run_provenance); a resumed run records its latest start
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check_same_run(self, path: Path) -> None:
        """Refuse to continue the run recorded at `path` (run.json) when it is another run."""
        if not path.is_file():
            return
        old, new = json.loads(path.read_text(encoding="utf-8")), self.to_dict()
        for key in DEFINING:
            if _defining(old.get(key)) != _defining(new[key]):
                raise UsageError(
                    f"{path.parent} holds a run with another {key} ({old.get(key)!r}, now {new[key]!r}):"
                    " use a new out folder"
                )


def _defining(value: Any) -> Any:
    return {k: v for k, v in value.items() if k not in MEASURED} if isinstance(value, dict) else value
