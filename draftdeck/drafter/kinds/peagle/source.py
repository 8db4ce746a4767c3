"""A P-EAGLE drafter as a draft source of real speculative decoding (`spec_decode.DraftSource`): one
drafter forward per verify step proposes a chain of K drafts, as vLLM's parallel drafting runs it.

The drafter keeps its keys and values for every committed pair s (the target's tapped states at s,
the token at s + 1), as EAGLE-3's source does. Proposing after the anchor (the last committed token,
at position a), one forward over the pairs not yet cached (positions cached..a - 1) followed by K - 1
parallel positions (the mask token, `fc(mask_hidden)`, rope positions a..a + K - 2), causal: the
output at a - 1 gives draft 1 and parallel position j draft j + 1. That is `PEagleDrafter.parallel`'s
chain at anchor a - 1, so the walk over its runs is this decoding. The parallel positions' keys are
dropped after the proposal (they are speculative); the pairs' are kept.
"""

from __future__ import annotations

import torch

from draftdeck.drafter.kinds.eagle3.model import StepKV
from draftdeck.drafter.kinds.eagle3.source import Eagle3Source
from draftdeck.drafter.kinds.peagle.model import PEagleDrafter
from draftdeck.drafter.model.target import Target


class PEagleSource(Eagle3Source):
    drafter: PEagleDrafter

    def __init__(self, drafter: PEagleDrafter, target: Target):
        super().__init__(drafter, target)
        self.forwards = 0  # drafter forwards run: one per proposal

    @torch.inference_mode()
    def propose(self, committed: list[int], k: int) -> list[int]:
        anchor = len(committed) - 1
        aux = torch.cat(self.pending, dim=0)[None]
        if self.cached + aux.shape[1] != anchor:
            covered = self.cached + aux.shape[1]
            raise RuntimeError(f"the drafter's context covers {covered} positions, the anchor is at {anchor}")
        if anchor == 0 or k < 1:  # no committed pair yet (a one-token prompt), or nothing wanted
            return []
        d, dev, start = self.drafter, aux.device, self.cached
        k = min(k, d.config.num_depths)  # the depths it was trained to draft
        tokens = torch.tensor(
            [committed[start + 1 : anchor + 1] + [d.config.mask_token_id] * (k - 1)], device=dev
        )
        hidden = torch.cat([d.fc(aux), d.mask_inputs().to(aux.dtype).expand(1, k - 1, -1)], dim=1)
        positions = torch.arange(start, anchor + k - 1, device=dev)[None]
        h, (keys, values) = d.extend(self.target.embed(tokens), hidden, positions, self.past)
        self.forwards += 1
        self.past: StepKV | None = (keys[:, :, :anchor], values[:, :, :anchor])  # the pairs' keys only
        self.cached, self.pending = anchor, []
        drafts = d.target_ids(d.logits(h[0, -k:]).argmax(-1))
        return [int(x) for x in drafts]
