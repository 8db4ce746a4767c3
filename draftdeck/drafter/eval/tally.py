"""One prompt decoded every way the eval compares (target alone, then each draft source), and the
counts of a set of prompts (:class:`Tally`): the whole eval, or one suite's category."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from draftdeck.drafter.eval.spec_decode import (
    DecodeStats,
    DraftSource,
    Generation,
    Sampling,
    TargetRunner,
    generate_plain,
    generate_speculative,
)
from draftdeck.drafter.eval.tree import TreeShape
from draftdeck.drafter.eval.tree_decode import TreeSource, generate_tree


def ratio(a: float, b: float) -> float | None:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else None


@dataclass
class Decoded:
    plain: Generation  # target-only decoding: the reference output and the speed baseline
    methods: dict[str, Generation]


def decode(
    runner: TargetRunner,
    sources: dict[str, DraftSource],
    ids: list[int],
    max_new: int,
    block: int,
    s: Sampling,
    tree: TreeShape | None = None,
) -> Decoded:
    """With a `tree`, every source that drafts trees verifies one per step (prompt lookup stays a chain)."""
    plain = generate_plain(runner, ids, max_new, s)
    gens = {
        name: generate_tree(runner, src, ids, max_new, tree, s)
        if tree is not None and isinstance(src, TreeSource)
        else generate_speculative(runner, src, ids, max_new, block, s)
        for name, src in sources.items()
    }
    return Decoded(plain, gens)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@dataclass
class Tally:
    """Counts of a set of prompts: target-only decoding, each method's, and where each method's greedy
    output first left the target's (the lossless check)."""

    block: int
    greedy: bool
    plain: DecodeStats = field(init=False)
    methods: dict[str, DecodeStats] = field(init=False)
    differs: dict[str, dict[str, Any] | None] = field(init=False)
    prompts: int = 0

    def __post_init__(self) -> None:
        self.plain = DecodeStats(self.block)
        # the drafter first; each other method (baselines, a scheduled drafter) as it is decoded
        self.methods = {"drafter": DecodeStats(self.block)}
        self.differs = {"drafter": None}

    def add(self, d: Decoded, where: dict[str, Any]) -> None:
        """Count one decoded prompt; `where` names it in a lossless break (prompt, file, line)."""
        self.prompts += 1
        self.plain.add(d.plain)
        for name, gen in d.methods.items():
            self.methods.setdefault(name, DecodeStats(self.block)).add(gen)
            self.differs.setdefault(name, None)
            if self.greedy and self.differs[name] is None and gen.output_ids != d.plain.output_ids:
                self.differs[name] = {
                    **where,
                    "token_index": _first_difference(gen.output_ids, d.plain.output_ids),
                }

    def target_only(self) -> dict[str, Any]:
        p = self.plain
        return {"tokens": p.tokens, "seconds": round(p.seconds, 4), "tokens_per_s": p.tokens_per_s,
                "cpu_seconds": round(p.cpu_seconds, 4), "tokens_per_cpu_s": p.tokens_per_cpu_s}  # fmt: skip

    def method_entries(self) -> dict[str, Any]:
        """Each method's counts and ratios, its speed-up over the target alone and its lossless check."""
        out = {}
        for name, st in self.methods.items():
            entry = st.to_dict()
            # wall-clock speedup, and the same per CPU second (steadier when other work shares the CPU)
            entry["speedup_vs_target_only"] = ratio(entry["tokens_per_s"], self.plain.tokens_per_s)
            entry["cpu_speedup_vs_target_only"] = ratio(
                entry["tokens_per_cpu_s"], self.plain.tokens_per_cpu_s
            )
            if self.greedy:
                entry["lossless"] = self.differs[name] is None
                entry["first_difference"] = self.differs[name]
            else:
                entry["lossless"] = None
                entry["first_difference"] = (
                    "not checked token by token in sampled mode (lossless in distribution)"
                )
            out[name] = entry
        return out
