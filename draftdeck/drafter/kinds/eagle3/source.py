"""An EAGLE-3 drafter as a draft source of real speculative decoding (`spec_decode.DraftSource`): a
chain of drafts, each the argmax of the drafter's draft vocabulary mapped to a target id.

The drafter keeps its own keys and values for every committed position s: the pair (the target's
tapped states at s, the token at s + 1), which is why a position's pair waits until the next token
is committed. Proposing after the anchor (the last committed token, at position a):

1. the pairs not yet in the drafter's cache, positions cached..a - 1, run as step 0 (their keys
   kept); the output at a - 1 gives draft 1;
2. draft j + 1 runs one position (draft j's embedding, draft j's output as its hidden state) at rope
   position a - 1 + j, seeing the committed keys and the chain's own; those keys are dropped after
   the proposal (they are speculative).

That is `Eagle3Drafter.ttt`'s step k at t = a - 1, so the walk over its runs is this decoding.
"""

from __future__ import annotations

import torch

from draftdeck.drafter.kinds.eagle3.model import Eagle3Drafter, StepKV
from draftdeck.drafter.model.target import Target


class Eagle3Source:
    def __init__(self, drafter: Eagle3Drafter, target: Target):
        self.drafter = drafter.eval()
        self.target = target
        # `spec_decode` reads `hidden_states[i + 1]` for a layer id i: the tapped index minus one
        self.layer_ids: list[int] | None = drafter.config.target_layer_ids
        self.past: StepKV | None = None
        self.cached = 0
        self.pending: list[torch.Tensor] = []

    def begin(self, prompt_ids: list[int]) -> None:
        self.past, self.cached, self.pending = None, 0, []

    def observe(self, features: torch.Tensor | None) -> None:
        if features is None:
            raise ValueError("an EAGLE-3 drafter needs the target's tapped hidden states")
        self.pending.append(features)

    @torch.inference_mode()
    def propose(self, committed: list[int], k: int) -> list[int]:
        anchor = len(committed) - 1
        aux = torch.cat(self.pending, dim=0)[None]
        if self.cached + aux.shape[1] != anchor:
            covered = self.cached + aux.shape[1]
            raise RuntimeError(f"the drafter's context covers {covered} positions, the anchor is at {anchor}")
        if anchor == 0 or k < 1:  # no committed pair yet (a one-token prompt), or nothing wanted
            return []
        dev = aux.device
        start, d = self.cached, self.drafter
        tokens = torch.tensor([committed[start + 1 : anchor + 1]], dtype=torch.long, device=dev)
        positions = torch.arange(start, anchor, device=dev)[None]
        h, self.past = d.extend(self.target.embed(tokens), d.fc(aux), positions, self.past)
        self.cached, self.pending = anchor, []
        hidden, past, drafts = h[:, -1:], self.past, []
        for j in range(k):
            token = d.target_ids(d.logits(hidden[0, -1]).argmax(-1))
            drafts.append(int(token))
            if j + 1 == k:
                break
            at = torch.tensor([[anchor + j]], device=dev)
            hidden, past = d.extend(self.target.embed(token.view(1, 1)), hidden, at, past)
        return drafts
