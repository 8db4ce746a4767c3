"""A sweep's points read as figures: each point's counts (what sweep.json stores), its ratios (computed
here, when shown), the Pareto front of tau against speed, and the point to serve with its launch flags.

Every tau counts the bonus token, as vLLM's counters do: (accepted + verify steps) / verify steps.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# What eval.json's counts call the target's verified tokens (the tree's nodes, a chain's block), when the
# eval records them: the target's extra work per step, the figure that carries over to a GPU with tau.
VERIFIED_KEY = "verified"

# The seconds a speed is counted in: the process's CPU seconds on a CPU (steady on a machine other work
# shares; wall-clock there swings with the neighbours' load), wall-clock on a GPU (whose kernels the CPU
# only waits for).
CLOCKS = {"cpu": "cpu_seconds", "wall": "seconds"}


def clock_of(device: str) -> str:
    return "cpu" if device == "cpu" else "wall"


RULE = (
    "the fastest point (speculative tokens/s) among the lossless ones: greedy points whose output equalled"
    " target-only decoding token for token, and sampled points (lossless in distribution by speculative"
    " sampling, not checked token by token); a point whose output left the target's is never recommended"
)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b <= 0:
        return None
    return a / b


@dataclass(frozen=True)
class Point:
    """One grid point's counts, as sweep.json stores them."""

    point: int
    params: dict[str, Any]  # the grid's values at this point
    eval_json: str  # its eval.json, relative to sweep.json
    method: str  # the eval method the figures are of: drafter, or drafter_scheduled with a threshold
    block_size: int  # the verify block used (1 + drafts a step)
    accepted: int
    verify_steps: int
    verified: int | None  # tokens the target verified (None: the eval does not count them)
    tokens: int
    seconds: float  # of CLOCKS[clock]
    target_tokens: int
    target_seconds: float
    lossless: bool | None  # None: sampled, lossless in distribution, not checked token by token
    # the draft tree each step verified (budget, topk, depth); None: chains
    tree: dict[str, int] | None = None

    @property
    def tau(self) -> float | None:
        return _ratio(self.accepted + self.verify_steps, self.verify_steps)

    @property
    def verified_per_step(self) -> float | None:
        return _ratio(self.verified, self.verify_steps) if self.verified is not None else None

    @property
    def tokens_per_s(self) -> float | None:
        return _ratio(self.tokens, self.seconds)

    @property
    def target_tokens_per_s(self) -> float | None:
        return _ratio(self.target_tokens, self.target_seconds)

    @property
    def speedup(self) -> float | None:
        return _ratio(self.tokens_per_s, self.target_tokens_per_s)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Point:
        return cls(**{k: row[k] for k in cls.__dataclass_fields__ if k in row})

    @classmethod
    def from_eval(
        cls, n: int, params: dict[str, Any], eval_json: str, ev: dict[str, Any], clock: str = "wall"
    ) -> Point:
        """A point from its eval's figures (eval.json's `eval`), its speeds in `clock`'s seconds."""
        seconds = CLOCKS[clock]
        method = "drafter_scheduled" if ev.get("confidence_threshold") is not None else "drafter"
        entry = ev["methods"][method]
        counts = entry["counts"]
        verified = counts.get(VERIFIED_KEY)
        return cls(
            point=n, params=params, eval_json=eval_json, method=method, block_size=int(ev["block_size"]),
            accepted=int(counts["accepted"]), verify_steps=int(counts["verify_steps"]),
            verified=int(verified) if verified is not None else None,
            tokens=int(counts["tokens"]), seconds=float(counts[seconds]),
            target_tokens=int(ev["target_only"]["tokens"]),
            target_seconds=float(ev["target_only"][seconds]),
            lossless=entry["lossless"], tree=ev.get("tree"),
        )  # fmt: skip


def pareto_front(points: list[Point]) -> list[Point]:
    """The points no other point beats on both tau and tokens/s (ties kept), fastest first."""
    known = [p for p in points if p.tau is not None and p.tokens_per_s is not None]

    def beaten(p: Point) -> bool:
        assert p.tau is not None and p.tokens_per_s is not None
        return any(
            q.tau >= p.tau
            and q.tokens_per_s >= p.tokens_per_s
            and (q.tau, q.tokens_per_s) != (p.tau, p.tokens_per_s)
            for q in known
            if q.tau is not None and q.tokens_per_s is not None
        )

    return sorted((p for p in known if not beaten(p)), key=lambda p: -(p.tokens_per_s or 0.0))


def recommend(points: list[Point]) -> Point | None:
    """The point to serve (RULE); None when no lossless point has a speed."""
    fit = [p for p in points if p.lossless is not False and p.tokens_per_s is not None]
    return max(fit, key=lambda p: (p.tokens_per_s or 0.0, p.tau or 0.0), default=None)


def _with_options(line: str, extra: str) -> str:
    """`line` with the options of `extra` appended, each replacing the value `line` gave it (a tree's
    top-k where the chain's line says 1)."""
    given = set(extra.split())
    kept = re.sub(r"\s(--[\w-]+)\s+\S+", lambda m: "" if m[1] in given else m[0], line)
    return f"{kept} {extra}"


def serving_flags(point: Point, checkpoint: str, target: str) -> list[dict[str, Any]]:
    """How vLLM and SGLang launch the drafter as `point` decoded: the drafter kind's own readings
    (DrafterKind.served) drafting its block, for the checkpoint folder in the kind's first export format,
    with the kind's tree options where the point verified trees (DrafterKind.tree_flags)."""
    from draftdeck.drafter.export.drafters import folder_kind
    from draftdeck.drafter.export.folder import resolve_checkpoint

    folder = resolve_checkpoint(Path(checkpoint))
    kind = folder_kind(folder)
    readings = kind.served(folder, kind.formats[0], target, point.block_size)
    for r in readings if point.tree else ():
        assert point.tree is not None
        extra = kind.tree_flags(str(r["server"]), point.tree)
        if extra and r.get("flags"):
            r["flags"] = _with_options(str(r["flags"]), extra)
        else:
            r["problems"] = [*r.get("problems", []), f"no {r['server']} option is known to verify this"
                             f" {kind.title} tree: these flags serve chains"]  # fmt: skip
    return readings
