"""Draft trees: what a tree-drafting source proposes, how its nodes are chosen under a budget, and how
a verify step accepts a path of it (greedy, or sampled by recursive rejection over siblings).

A tree hangs from the anchor (the last committed token, the root, not a node). Each node has a parent
(-1: the anchor) and a depth (1 for the anchor's children). Nodes come parents first, and siblings in
the order they were chosen (the drafter's own chain first, then by probability), which is the order
sampled acceptance tries them in.

Choosing the nodes (`best_first`) is DDTree's construction: of all candidate paths, the `budget` most
probable by the product of their per-position probabilities, grown best-first from the anchor (a
child is never more probable than its parent, so the chosen set is closed under ancestors). One
addition of ours: the drafter's own chain (what a chain verify step would check) is taken first, so a
tree whose budget covers the chain verifies a superset of it and never accepts less at the same state.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from draftdeck.drafter.eval.spec_decode import draw

DEFAULT_TOPK = 4  # candidates per node when --tree-topk is not given


@dataclass(frozen=True)
class TreeShape:
    """The tree a verify step may check: `budget` nodes (the anchor not counted), each node's `topk`
    most probable children at most, `depth` levels at most (the drafts of a chain of the same block)."""

    budget: int
    topk: int
    depth: int

    def to_dict(self) -> dict[str, int]:
        return {"budget": self.budget, "topk": self.topk, "depth": self.depth}


@dataclass
class Candidate:
    """A node a tree may take: its token, its path's log-probability under the drafter, its depth,
    whether it lies on the drafter's own chain, and its parent (-1: the anchor; else an index into the
    builder's candidate list)."""

    token: int
    score: float
    depth: int
    on_chain: bool
    parent: int


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # index into tokens; -1: the anchor
    depths: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """The nodes whose parent is `node` (-1: the anchor's), in the tree's order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    @classmethod
    def chain(cls, tokens: list[int]) -> DraftTree:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), list(range(1, len(tokens) + 1)))


Expand = Callable[[int], list[int]]  # a taken candidate's index -> its children's indices in the pool


def best_first(pool: list[Candidate], roots: list[int], expand: Expand, budget: int) -> DraftTree:
    """Up to `budget` nodes of the candidates `pool` (which `expand` may grow): the drafter's chain
    first, then the most probable candidates, each taken only after its parent. `roots`: the anchor's
    children; `expand(i)`: the children of candidate i, asked only once it is taken."""

    def key(i: int) -> tuple[int, float, int]:
        return (0 if pool[i].on_chain else 1, -pool[i].score, i)

    heap = [key(i) for i in roots]
    heapq.heapify(heap)
    tree, node_of = DraftTree(), {-1: -1}
    while heap and len(tree) < budget:
        i = heapq.heappop(heap)[2]
        c = pool[i]
        node_of[i] = len(tree)
        tree.tokens.append(c.token)
        tree.parents.append(node_of[c.parent])
        tree.depths.append(c.depth)
        for j in expand(i):
            heapq.heappush(heap, key(j))
    return tree


def ddtree(logprobs: torch.Tensor, chain: list[int], shape: TreeShape) -> DraftTree:
    """DDTree from one block: `logprobs` (D, V) the drafter's log-distribution at each of its D draft
    positions (independent of the path, as one block forward gives them), `chain` the drafter's own
    drafts. A node at depth d has the top-`topk` tokens of position d as its children (the chain's
    token too, on the chain)."""
    depth = min(shape.depth, logprobs.shape[0])
    top_lp, top_ids = logprobs[:depth].topk(min(shape.topk, logprobs.shape[1]), dim=-1)
    options: list[list[tuple[int, float]]] = []
    for d in range(depth):
        row = list(zip(top_ids[d].tolist(), top_lp[d].tolist(), strict=True))
        if d < len(chain) and chain[d] not in top_ids[d].tolist():
            row.append((chain[d], float(logprobs[d, chain[d]])))
        options.append(row)
    pool: list[Candidate] = []

    def children(parent: int) -> list[int]:
        d, score, on_chain = (0, 0.0, True) if parent < 0 else (pool[parent].depth, pool[parent].score,
                                                                 pool[parent].on_chain)  # fmt: skip
        if d >= depth:
            return []
        first = len(pool)
        pool.extend(Candidate(t, score + lp, d + 1, on_chain and d < len(chain) and t == chain[d], parent)
                    for t, lp in options[d])  # fmt: skip
        return list(range(first, len(pool)))

    return best_first(pool, children(-1), children, shape.budget)


def tree_words(shape: TreeShape) -> str:
    """The tree, as the eval's log and page name it."""
    return f"trees of {shape.budget} nodes (top-{shape.topk}, depth {shape.depth})"


# -- accepting a path --------------------------------------------------------------------------------


def accept_greedy(tree: DraftTree, posterior: list[int]) -> tuple[list[int], int]:
    """The longest path the target agrees with: `posterior[i]` the target's argmax after input i (0:
    the anchor, 1 + n: node n). Returns (the accepted nodes, root to leaf; the token after them)."""
    path: list[int] = []
    at = -1
    while True:
        want = posterior[at + 1]
        nxt = next((c for c in tree.children(at) if tree.tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        at = nxt


def accept_sampled_tree(tree: DraftTree, probs: torch.Tensor, gen: torch.Generator) -> tuple[list[int], int]:
    """Multi-candidate speculative sampling for deterministic drafts (SpecInfer; EAGLE's
    evaluate_posterior): at a node, its children are tried in order, each accepted with its
    probability under the target's residual distribution; a rejected child's token is zeroed and the
    residual renormalised; when none is accepted the next token is drawn from the residual. Every
    emitted token is then distributed as the target's `probs` (inputs x V, as `accept_greedy`'s)."""
    path: list[int] = []
    at = -1
    while True:
        residual = probs[at + 1].clone()
        accepted = None
        for c in tree.children(at):
            x = tree.tokens[c]
            if float(torch.rand((), generator=gen)) < float(residual[x]):
                accepted = c
                break
            residual[x] = 0.0
            mass = float(residual.sum())
            if mass <= 0:  # every token the target allows was drafted and rejected: cannot happen
                break  # with p's own mass (a token of p(x) = 1 is accepted), kept for rounding
            residual = residual / mass
        if accepted is None:
            mass = float(residual.sum())
            return path, draw(residual / mass if mass > 0 else probs[at + 1], gen)
        path.append(accepted)
        at = accepted
