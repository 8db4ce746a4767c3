"""`draftdeck plan`'s plan (`plan_for`), and when no sharding fits, what would: each lever of the
train job alone, at the value nearest the one asked that fits, from the same counts
(draftdeck.drafter.train.plan):

- more devices: the fewest ranks (more on this node up to 8, then whole nodes) with a strategy that
  fits, or, when none up to 4,096 does, what a rank still needs then (an EAGLE-3 drafter's state and
  its working set are whole on every rank: more ranks do not divide them);
- fewer drafter layers (a kind with more than one);
- EAGLE-3: a smaller draft vocabulary, fewer TTT steps;
- shorter rows (`seq_length`), gradient checkpointing, a smaller held-out batch.

Each figure is a plan of its own (the per-rank peak of the strategy `--sharding auto` would take);
levers combine, but each is said alone so that each figure is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.train.params import PlanParams
from draftdeck.drafter.train.plan import (
    CountedTarget,
    Plan,
    PlannedDrafter,
    Shape,
    cache_disk,
    count_target,
    plan_counted,
    resolve_target,
    shape_of,
    target_config,
)
from draftdeck.units import binary_size, parse_size

MAX_RANKS = 4096  # PlanParams' bound on devices and nodes alike
NODE = 8  # devices a node holds, when the plan's one node could take more


@dataclass(frozen=True)
class Advice:
    """One lever: the options that fit (`flags`), the strategy then, its per-rank peak, and in words."""

    lever: str
    flags: str
    strategy: str | None  # None: no value of this lever fits (`said` says what a rank still needs)
    per_rank: int
    said: str

    def to_dict(self) -> dict[str, Any]:
        return {"lever": self.lever, "flags": self.flags, "strategy": self.strategy,
                "per_rank_bytes": self.per_rank, "said": self.said}  # fmt: skip


def fitting(p: Plan) -> tuple[str, int] | None:
    """The strategy auto would take among those that fit (replicated before sharded), and its peak."""
    for name in ("none", "ddp", "fsdp"):
        s = p.strategies.get(name)
        if s is not None and s.fits:
            return name, s.per_rank
    return None


def advise(p: Plan, target: CountedTarget, *, devices: int, nodes: int) -> list[Advice]:
    """What would fit, each lever alone (module doc); nothing when the plan fits."""
    if p.fits or p.capacity is None:
        return []
    capacity = p.capacity
    drafters: dict[Shape, PlannedDrafter] = {}  # built on the meta device once per shape, not per world

    def planned(shape: Shape) -> Plan:
        key = replace(shape, world=1)
        if key not in drafters:
            drafters[key] = get_kind(shape.drafter).plan(shape, target.config)
        return plan_counted(target, shape, capacity, batches=False, drafter=drafters[key])

    def at(shape: Shape) -> tuple[str, int] | None:
        return fitting(planned(shape))

    levers: list[Callable[[], Advice | None]] = [
        lambda: _devices(p, planned, devices, nodes),
        lambda: _smaller(p, at, "layers", "--layers", p.shape.layers, "fewer drafter layers")
        if p.drafter_layers > 1 else None,
        lambda: _smaller(p, at, "draft_vocab_size", "--draft-vocab-size", p.draft_vocab_size or 0,
                         f"a smaller draft vocabulary (of the target's {target.config.vocab_size:,} ids)",
                         step=1000) if p.drafter == "eagle3" else None,
        lambda: _smaller(p, at, "ttt_steps", "--ttt-steps", p.shape.ttt_steps, "fewer TTT steps (shorter"
                         " chains drafted)") if p.drafter == "eagle3" else None,
        lambda: _smaller(p, at, "seq_length", "--seq-length", p.shape.seq_length, "shorter rows (train cuts"
                         " longer ones there)", step=256, lo=2),
        lambda: _checkpointing(p, at),
        lambda: _smaller(p, at, "eval_batch_size", "--eval-batch-size", p.shape.eval_batch_size,
                         "a smaller held-out batch"),
    ]  # fmt: skip
    return [a for lever in levers if (a := lever()) is not None]


def _largest(lo: int, hi: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] that fits, the figure falling as n does; None when not even lo."""
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _set(shape: Shape, name: str, value: int) -> Shape:
    changes: dict[str, Any] = {name: value}
    return replace(shape, **changes)


def _smallest(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """The smallest n in [lo, hi] that fits, given that hi does and the figure falls as n grows."""
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def _smaller(
    p: Plan, at: Callable[[Shape], tuple[str, int] | None], name: str, flag: str, current: int, said: str,
    *, step: int = 1, lo: int = 1,
) -> Advice | None:  # fmt: skip
    """The largest value of the shape's `name` below `current` (at least `lo`) that fits (a multiple
    of `step` when one fits), or None."""
    best = _largest(lo, current - 1, lambda n: at(_set(p.shape, name, n)) is not None)
    if best is None:
        return None
    if best >= 2 * step and at(_set(p.shape, name, best // step * step)) is not None:
        best = best // step * step
    fit = at(_set(p.shape, name, best))
    assert fit is not None
    return Advice(name, f"{flag} {best}", fit[0], fit[1], f"{said}: {flag} {best} fits ({_peak(fit)})")


def _checkpointing(p: Plan, at: Callable[[Shape], tuple[str, int] | None]) -> Advice | None:
    if p.shape.gradient_checkpointing:
        return None
    fit = at(replace(p.shape, gradient_checkpointing=True))
    if fit is None:
        return None
    said = f"gradient checkpointing (the drafter's activations recomputed): fits ({_peak(fit)})"
    return Advice("gradient_checkpointing", "--gradient-checkpointing", fit[0], fit[1], said)


def _devices(p: Plan, planned: Callable[[Shape], Plan], devices: int, nodes: int) -> Advice:
    """The fewest ranks that fit: first more devices on the one node (up to 8), then whole nodes
    (doubled until they fit, then the fewest between); else the least a rank needs on any tried."""
    least: list[tuple[int, int]] = []  # (per rank, ranks) of every world tried

    def at(per_node: int, n: int) -> tuple[str, int] | None:
        there = planned(replace(p.shape, world=per_node * n))
        least.append((min(s.per_rank for s in there.strategies.values()), per_node * n))
        return fitting(there)

    for d in range(devices + 1, max(devices, NODE) + 1) if nodes == 1 else ():
        fit = at(d, 1)
        if fit is not None:
            return _more(d, 1, fit)
    per_node = max(devices, NODE) if nodes == 1 else devices
    most = MAX_RANKS // per_node
    failed, n = nodes, nodes + 1  # the nodes known not to fit, and the next to try
    while n <= most:
        if at(per_node, n) is not None:
            fewest = _smallest(failed + 1, n, lambda k: at(per_node, k) is not None)
            fit = at(per_node, fewest)
            assert fit is not None
            return _more(per_node, fewest, fit)
        failed, n = n, (most + 1 if n == most else min(2 * n, most))
    floor, ranks = min(least) if least else (min(s.per_rank for s in p.strategies.values()), p.shape.world)
    whole = " (an EAGLE-3 drafter, its AdamW state and its working set are whole on every rank)"
    said = (
        f"more devices alone do not fit: the least a rank needs is {binary_size(floor)}, on {ranks:,} ranks"
        + (whole if p.drafter == "eagle3" else "")
    )
    return Advice("devices", "", None, floor, said)


def _more(per_node: int, n: int, fit: tuple[str, int]) -> Advice:
    flags = f"--devices {per_node}" + (f" --nodes {n}" if n > 1 else "")
    said = f"more devices: {per_node * n:,} ranks ({flags}) fit ({_peak(fit)})"
    return Advice("devices", flags, fit[0], fit[1], said)


def _peak(fit: tuple[str, int]) -> str:
    return f"{fit[0]}, {binary_size(fit[1])} per rank"


def plan_for(params: PlanParams) -> Plan:
    """`draftdeck plan`'s plan: the target's config, the train job's shape, the devices; when nothing
    fits, what would (`advise`)."""
    e, world = (2 if params.dtype == "bf16" else 4), params.devices * params.nodes
    shape = shape_of(params, seq_length=params.seq_length, element_size=e, world=world)
    _, config_from = resolve_target(params.target)
    target = count_target(target_config(params.target))
    result = plan_counted(target, shape, parse_size(params.device_memory))
    result.config_from = config_from
    if params.hidden_states:  # what the cache takes on disk, beside what the run takes in memory
        result.cache_disk = cache_disk(params, target.config, shape)
    if not result.fits:
        result.advice = advise(result, target, devices=params.devices, nodes=params.nodes)
    return result
