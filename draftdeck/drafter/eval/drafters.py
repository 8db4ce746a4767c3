"""What `eval` does differently per drafter kind: how a checkpoint loads, which verify block it drafts
(1 + the drafts a step proposes: DFlash's block size, EAGLE-3's chain length, by default the TTT steps
it was trained with), its draft source for real decoding, its untrained baseline, the checks that it
was trained for this target, and the walked estimate over the target's own outputs (the training's
walk: `walked.heldout_counts` for DFlash, the TTT walk for EAGLE-3)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.eval.baselines import untrained_drafter
from draftdeck.drafter.eval.eagle3_source import Eagle3Source
from draftdeck.drafter.eval.spec_decode import DFlashSource, DraftSource
from draftdeck.drafter.export.drafters import load_drafter
from draftdeck.drafter.export.eagle3 import trained_drafts
from draftdeck.drafter.export.format import resolve_checkpoint
from draftdeck.drafter.model.dflash import DFlashDrafter
from draftdeck.drafter.model.eagle3 import Eagle3Drafter
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.eagle3_walked import eagle3_heldout_pass
from draftdeck.drafter.train.walked import heldout_counts
from draftdeck.errors import UsageError


@dataclass
class Checkpoint:
    """A loaded drafter, its kind and its own verify block (1 + drafts per step)."""

    drafter: DFlashDrafter | Eagle3Drafter
    kind: str
    block: int

    def source(self, target: Target, block: int, *, untrained_seed: int | None = None) -> DraftSource:
        model = (
            self.drafter if untrained_seed is None else untrained_drafter(self.drafter, seed=untrained_seed)
        )
        if isinstance(model, Eagle3Drafter):
            return Eagle3Source(model, target)
        return DFlashSource(model, target, block)


def load_checkpoint(path: Path, *, device: str | torch.device = "cpu") -> Checkpoint:
    drafter = load_drafter(Path(path), device=device)
    if isinstance(drafter, DFlashDrafter):
        return Checkpoint(drafter, "dflash", drafter.block_size)
    return Checkpoint(drafter, "eagle3", trained_drafts(resolve_checkpoint(Path(path))) + 1)


def check_pair(target: Target, ck: Checkpoint, checkpoint: str, target_name: str) -> None:
    """Refuse a drafter trained for another target: its width, vocabulary or tapped layers."""
    cfg = ck.drafter.config
    problems = []
    hidden = getattr(cfg, "target_hidden_size", cfg.hidden_size)
    if hidden != int(target.config.hidden_size):
        problems.append(f"hidden size {hidden} vs the target's {target.config.hidden_size}")
    if cfg.vocab_size != int(target.config.vocab_size):
        problems.append(f"vocabulary {cfg.vocab_size} vs the target's {target.config.vocab_size}")
    if isinstance(ck.drafter, Eagle3Drafter):
        bad = [i for i in ck.drafter.config.aux_layer_ids if i > target.num_layers]
        what = f"hidden_states {bad} do not exist (the target has {target.num_layers} layers)"
    else:
        bad = [i for i in ck.drafter.config.target_layer_ids if i >= target.num_layers]
        what = f"target layers {bad} do not exist (the target has {target.num_layers})"
    if bad:
        problems.append(what)
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
    if isinstance(ck.drafter, Eagle3Drafter):
        counts = eagle3_heldout_pass(ck.drafter, target, batches, block - 1, judge=False, with_loss=False)[0]
    else:
        walker: Any = copy.copy(ck.drafter)  # shares the weights; only the block size may differ
        walker.block_size = block
        counts = heldout_counts(walker, target, batches, gamma=7.0)
    return counts.walked_accepted, counts.walked_steps, counts.walked_hist
