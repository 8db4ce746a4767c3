"""The target's MTP layer as a draft source of real speculative decoding (`spec_decode.DraftSource`): a
chain of drafts, each the argmax of the target's LM head over the layer's output, as vLLM's `method: mtp`
proposes them.

The layer keeps its own keys and values for every committed position s: the pair (the target's last
hidden state at s, the token at s + 1), which is why a position's pair waits until the next token is
committed. Proposing after the anchor (the last committed token, at position a):

1. the pairs not yet in the layer's cache, positions cached..a - 1, at their own rope positions (their
   keys kept); the output at a - 1 gives draft 1;
2. draft j + 1 runs one position (draft j's embedding, draft j's output as its hidden state) at rope
   position a - 1 + j, seeing the committed keys and the chain's own, which are dropped after the
   proposal (they are speculative).

That is `MTPDrafter.ttt`'s step k at t = a - 1, so the held-out walk over its runs is this decoding.
"""

from __future__ import annotations

import torch

from draftdeck.drafter.kinds.eagle3.model import StepKV
from draftdeck.drafter.kinds.mtp.model import MTPDrafter
from draftdeck.drafter.model.target import Target


class MTPSource:
    def __init__(self, drafter: MTPDrafter, target: Target):
        self.drafter = drafter.eval().share_head(target.lm_head)
        self.target = target
        # `spec_decode` reads `hidden_states[i + 1]` for a layer id i: the last, after the final norm
        self.layer_ids: list[int] | None = drafter.config.target_layer_ids
        self.past: StepKV | None = None
        self.cached = 0
        self.pending: list[torch.Tensor] = []

    def begin(self, prompt_ids: list[int]) -> None:
        self.past, self.cached, self.pending = None, 0, []

    def observe(self, features: torch.Tensor | None) -> None:
        if features is None:
            raise ValueError("an MTP layer needs the target's last hidden states")
        self.pending.append(features)

    @torch.inference_mode()
    def propose(self, committed: list[int], k: int) -> list[int]:
        anchor = len(committed) - 1
        hidden = torch.cat(self.pending, dim=0)[None]
        if self.cached + hidden.shape[1] != anchor:
            covered = self.cached + hidden.shape[1]
            raise RuntimeError(
                f"the MTP layer's context covers {covered} positions, the anchor is at {anchor}"
            )
        if anchor == 0 or k < 1:  # no committed pair yet (a one-token prompt), or nothing wanted
            return []
        d, dev, start = self.drafter, hidden.device, self.cached
        dtype = next(d.parameters()).dtype
        tokens = torch.tensor([committed[start + 1 : anchor + 1]], dtype=torch.long, device=dev)
        positions = torch.arange(start, anchor, device=dev)[None]
        out, self.past = d.extend(self.target.embed(tokens).to(dtype), hidden.to(dtype), positions, self.past)
        self.cached, self.pending = anchor, []
        h, past, drafts = out[:, -1:], self.past, []
        for j in range(k):
            token = d.logits(h[0, -1]).argmax(-1)
            drafts.append(int(token))
            if j + 1 == k:
                break
            at = torch.tensor([[anchor + j]], device=dev)
            h, past = d.extend(self.target.embed(token.view(1, 1)).to(dtype), h, at, past)
        return drafts
