"""Acceptance over a window between two scrapes, from counter deltas summed over engines, per
`model_name`. Counts are kept; the ratios are properties, computed when shown:

- acceptance rate = accepted / draft tokens;
- tau incl. bonus = 1 + accepted / drafts (a bonus token on every verify step, as vLLM counts);
- p_i = per_position_i / drafts, the share of drafts that accepted more than i tokens (sum = tau - 1);
- P(accepted = k) = p_{k-1} - p_k with p_{-1} = 1.

An engine whose counter went down restarted inside the window: its counts since the restart are its
values now (never a negative rate), and the window says how many engines restarted. An engine new in
the second scrape counts the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftdeck.serving.exposition import Engine, Scrape


@dataclass
class Window:
    model_name: str
    seconds: float
    engines: int = 0
    restarted: int = 0  # engines that restarted (or appeared) inside the window
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    # per position i: drafts that accepted more than i tokens; None where the series is missing
    per_position_counts: list[int | None] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def tau_incl_bonus(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def per_position(self) -> list[float | None]:
        """p_0 .. p_{k-1}."""
        if not self.drafts:
            return [None] * len(self.per_position_counts)
        return [None if n is None else n / self.drafts for n in self.per_position_counts]

    @property
    def accepted_length(self) -> list[float | None]:
        """P(accepted = k) for k = 0 .. len(per_position): p_{k-1} - p_k, p_{-1} = 1, p_k past the end 0."""
        p = self.per_position
        if not p or not self.drafts:
            return []
        before: list[float | None] = [1.0, *p]
        after: list[float | None] = [*p, 0.0]
        return [None if a is None or b is None else a - b for a, b in zip(before, after, strict=True)]

    def to_json(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "seconds": round(self.seconds, 3),
            "engines": self.engines,
            "restarted": self.restarted,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "per_position_counts": self.per_position_counts,
            "acceptance_rate": self.acceptance_rate,
            "tau_incl_bonus": self.tau_incl_bonus,
            "tau_convention": "1 + accepted / drafts: a bonus token on every verify step, as vLLM counts",
            "per_position": self.per_position,
            "accepted_length": self.accepted_length,
        }


def _delta(now: Engine, before: Engine | None) -> tuple[Engine, bool]:
    """(counts inside the window, whether the engine restarted or is new)."""
    if before is None or now.went_down_from(before):
        return now, True
    return Engine(
        now.drafts - before.drafts,
        now.draft_tokens - before.draft_tokens,
        now.accepted - before.accepted,
        {i: v - before.per_position[i] for i, v in now.per_position.items() if i in before.per_position},
    ), False


def windows(before: Scrape, now: Scrape) -> list[Window]:
    """One Window per model_name of `now` (vLLM), summed over its engines, sorted by name. A position
    that any engine lacks (in either scrape) is None for the window, never a partial sum."""
    out: dict[str, Window] = {}
    per_engine: dict[str, list[dict[int, float]]] = {}
    for (model, engine), counters in sorted(now.engines.items()):
        delta, restarted = _delta(counters, before.engines.get((model, engine)))
        w = out.setdefault(model, Window(model, now.at - before.at))
        w.engines += 1
        w.restarted += int(restarted)
        w.drafts += round(delta.drafts)
        w.draft_tokens += round(delta.draft_tokens)
        w.accepted += round(delta.accepted)
        per_engine.setdefault(model, []).append(delta.per_position)
    for model, w in out.items():
        deltas = per_engine[model]
        k = max((i + 1 for d in deltas for i in d), default=0)
        w.per_position_counts = [
            round(sum(d[i] for d in deltas)) if all(i in d for d in deltas) else None for i in range(k)
        ]
    return [out[m] for m in sorted(out)]


def sum_positions(rows: list[list[int | None]]) -> list[int | None]:
    """Per-position counts of several windows summed: None at a position any of them lacks (a missing
    series is unknown, not zero)."""
    k = max((len(r) for r in rows), default=0)
    out: list[int | None] = [0] * k
    for r in rows:
        for i in range(k):
            n = r[i] if i < len(r) else None
            out[i] = None if n is None or out[i] is None else (out[i] or 0) + n
    return out
