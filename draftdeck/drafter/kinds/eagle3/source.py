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

from draftdeck.drafter.eval.tree import Candidate, DraftTree, TreeShape, best_first
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

    def _context(self, committed: list[int]) -> tuple[torch.Tensor, StepKV] | None:
        """Step 0: the pairs not yet in the drafter's cache run and kept; returns the output at the
        anchor's position - 1 (what draft 1 is read from) and the committed keys and values. None when
        there is no committed pair yet (a one-token prompt)."""
        anchor = len(committed) - 1
        aux = torch.cat(self.pending, dim=0)[None]
        if self.cached + aux.shape[1] != anchor:
            covered = self.cached + aux.shape[1]
            raise RuntimeError(f"the drafter's context covers {covered} positions, the anchor is at {anchor}")
        if anchor == 0:
            return None
        start, d = self.cached, self.drafter
        tokens = torch.tensor([committed[start + 1 : anchor + 1]], dtype=torch.long, device=aux.device)
        positions = torch.arange(start, anchor, device=aux.device)[None]
        h, self.past = d.extend(self.target.embed(tokens), d.fc(aux), positions, self.past)
        self.cached, self.pending = anchor, []
        return h[:, -1:], self.past

    def _step(
        self, token: torch.Tensor, hidden: torch.Tensor, at: int, past: StepKV
    ) -> tuple[torch.Tensor, StepKV]:
        """One drafted position: `token`'s embedding after `hidden` (its parent's output) at rope `at`."""
        position = torch.tensor([[at]], device=hidden.device)
        return self.drafter.extend(self.target.embed(token.view(1, 1)), hidden, position, past)

    @torch.inference_mode()
    def propose(self, committed: list[int], k: int) -> list[int]:
        context = self._context(committed) if k >= 1 else None
        if context is None:  # nothing wanted, or no committed pair yet
            return []
        anchor, d = len(committed) - 1, self.drafter
        (hidden, past), drafts = context, []
        for j in range(k):
            token = d.target_ids(d.logits(hidden[0, -1]).argmax(-1))
            drafts.append(int(token))
            if j + 1 == k:
                break
            hidden, past = self._step(token, hidden, anchor + j, past)
        return drafts

    @torch.inference_mode()
    def propose_tree(self, committed: list[int], shape: TreeShape) -> DraftTree:
        """EAGLE-2's dynamic tree: level by level, the `topk` most probable nodes of the level (by the
        product of the drafter's probabilities along their path; the chain's node too) are run and
        their `topk` children join the candidates; then the `budget` best candidates are taken, the
        chain's first (tree.best_first). Each run node extends its parent's keys and values, so a
        path sees exactly its own drafts; nodes run one at a time (a CPU's eval needs no batching)."""
        context = self._context(committed)
        if context is None or shape.depth < 1:
            return DraftTree()
        anchor, d = len(committed) - 1, self.drafter
        pool: list[Candidate] = []
        states: dict[int, tuple[torch.Tensor, StepKV]] = {-1: context}
        kids: dict[int, list[int]] = {}

        def grow(parent: int) -> list[int]:  # the `topk` children of a run node
            hidden = states[parent][0]
            depth, score, on_chain = (0, 0.0, True) if parent < 0 else (
                pool[parent].depth, pool[parent].score, pool[parent].on_chain)  # fmt: skip
            lp = torch.log_softmax(d.logits(hidden[0, -1]).float(), dim=-1)
            top_lp, top_ids = lp.topk(min(shape.topk, lp.shape[-1]))
            first = len(pool)
            for r, (t, p) in enumerate(zip(d.target_ids(top_ids).tolist(), top_lp.tolist(), strict=True)):
                pool.append(Candidate(int(t), score + p, depth + 1, on_chain and r == 0, parent))
            kids[parent] = list(range(first, len(pool)))
            return kids[parent]

        level = grow(-1)
        for depth in range(1, shape.depth):
            best = sorted(level, key=lambda i: -pool[i].score)[: shape.topk]
            frontier = best + [i for i in level if pool[i].on_chain and i not in best]
            level = []
            for i in frontier:
                hidden, past = states[pool[i].parent]
                token = torch.tensor(pool[i].token, device=hidden.device)
                states[i] = self._step(token, hidden, anchor + depth - 1, past)
                level += grow(i)
        return best_first(pool, kids[-1], lambda i: kids.get(i, []), shape.budget)
