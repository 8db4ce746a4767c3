"""What `eval` asks of a checkpoint, whatever its kind (draftdeck.drafter.kinds): how it loads, which
verify block it drafts (1 + the drafts a step proposes: DFlash's block size, EAGLE-3's chain length, by
default what it was trained with), its draft source for real decoding, its untrained baseline, the
checks that it was trained for this target, and the walked estimate over the target's own outputs (the
kind's own walk, as in training)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.eval.spec_decode import DraftSource
from draftdeck.drafter.export.drafters import folder_kind
from draftdeck.drafter.export.folder import read_config, resolve_checkpoint
from draftdeck.drafter.kinds import DrafterKind
from draftdeck.drafter.model.target import Target
from draftdeck.errors import UsageError


@dataclass
class Checkpoint:
    """A loaded drafter, its kind and its own verify block (1 + drafts per step)."""

    drafter: Any
    kind: DrafterKind
    block: int

    def source(self, target: Target, block: int, *, untrained_seed: int | None = None) -> DraftSource:
        model = self.drafter if untrained_seed is None else self.kind.untrained(self.drafter, untrained_seed)
        source: DraftSource = self.kind.source(model, target, block)
        return source


def load_checkpoint(path: Path, *, device: str | torch.device = "cpu") -> Checkpoint:
    folder = resolve_checkpoint(Path(path))
    kind = folder_kind(folder)
    return Checkpoint(kind.load(folder, device), kind, kind.verify_block(folder, read_config(folder)))


def check_pair(target: Target, ck: Checkpoint, checkpoint: str, target_name: str) -> None:
    """Refuse a drafter trained for another target: its width, vocabulary or tapped layers."""
    problems = ck.kind.pair_problems(ck.drafter, target)
    if problems:
        raise UsageError(f"{checkpoint} was not trained for {target_name}: " + "; ".join(problems))


def walked(
    ck: Checkpoint, target: Target, prompts: list[list[int]], outputs: list[list[int]], block: int
) -> tuple[int, int, list[int]]:
    """(accepted, steps, hist) of the walked estimate over prompt + the target's output, the output
    being the trained span, for drafts of `block - 1` tokens a step."""
    device = target.device
    batches = []
    for i in range(0, len(prompts), 16):
        rows = [(p, o) for p, o in zip(prompts[i : i + 16], outputs[i : i + 16], strict=True) if len(o) > 1]
        if not rows:
            continue
        width = max(len(p) + len(o) for p, o in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attn = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for r, (p, o) in enumerate(rows):
            ids[r, : len(p) + len(o)] = torch.tensor(p + o)
            attn[r, : len(p) + len(o)] = 1
            mask[r, len(p) : len(p) + len(o)] = 1
        batches.append((ids.to(device), attn.to(device), mask.to(device)))
    counts = ck.kind.walked(ck.drafter, target, batches, block)
    return counts.walked_accepted, counts.walked_steps, counts.walked_hist
