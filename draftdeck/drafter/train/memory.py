"""Know before you run: the peak memory a training run will need, from its shapes.

The estimate is what the run holds once the target and the drafter are loaded (measured: the
process's RSS on the CPU, allocated memory on a GPU), plus the drafter's gradients and AdamW state,
plus the larger of a training micro-batch's working set and a held-out batch's, at the longest row
the run reads. How large a working set is depends on the drafter kind: each kind's memory.py says
(`TrainKind.estimate`); this module asks it, before step 1, and refuses a run that cannot fit.

`tests/unit/drafter/train/test_memory.py` checks it against a measured peak (within 30 %).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from draftdeck.drafter.model.attention import Backend
from draftdeck.drafter.train.device import DeviceError, capacity_bytes, in_use_bytes, resident_weights_gap
from draftdeck.drafter.train.optimizers import OptimizerName
from draftdeck.drafter.train.params import TrainParams
from draftdeck.jobs.context import RunContext
from draftdeck.units import binary_size


@dataclass(frozen=True)
class Shapes:
    """What the working set depends on."""

    batch_size: int
    eval_batch_size: int
    longest: int  # tokens of the longest row the run reads
    anchors_per_forward: int
    block_size: int
    backend: Backend
    gradient_checkpointing: bool
    element_size: int  # activations: 4 (float32) or 2 (bf16)
    kl: bool = False  # the training loss reads the target's distribution at every slot
    state_shards: int = 1  # ranks the drafter's gradients and optimizer state are split over (fsdp)
    # whose state: AdamW's two moments, or Muon's one buffer (draftdeck.drafter.train.optimizers)
    optimizer: OptimizerName = "adamw"


@dataclass
class MemoryEstimate:
    held: int  # loaded now: weights, the process
    parts: dict[str, int]  # the largest phase's terms
    phase: str  # "training step" or "held-out pass"
    capacity: int | None  # what the device offers the run, when known
    phases: dict[str, int] = field(default_factory=dict)  # each phase's total

    @property
    def total(self) -> int:
        return self.held + sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.total <= self.capacity

    def to_dict(self) -> dict[str, object]:
        return {
            "total_bytes": self.total,
            "held_bytes": self.held,
            "phase": self.phase,
            "parts_bytes": dict(self.parts),
            "capacity_bytes": self.capacity,
            "phases_bytes": dict(self.phases),
        }

    def describe(self) -> str:
        parts = ", ".join(f"{k} {binary_size(v)}" for k, v in self.parts.items() if v >= 2**20)
        room = "" if self.capacity is None else f" of {binary_size(self.capacity)} available"
        held = binary_size(self.held)
        return f"about {binary_size(self.total)} at peak{room} (loaded {held}; {self.phase}: {parts})"


def params_bytes(module: nn.Module) -> int:
    """Bytes this process holds of `module`'s parameters and buffers (a sharded one: its shard)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(_local(t).numel() * t.element_size() for t in tensors)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def element_size(device: torch.device) -> int:
    return 2 if device.type == "cuda" else 4


def check_memory(
    kind: Any,
    target_config: object,
    params: TrainParams,
    longest: int,
    device: torch.device,
    backend: Backend,
    *,
    heldout_rows: int,
    weights: int = 0,
    sharing: int = 1,
    state_shards: int = 1,
    ctx: RunContext | None = None,
    enforce: bool = True,
) -> dict[str, object]:
    """Estimate the run's peak before step 1 (`kind`: the run's `TrainKind`, which estimates its working
    set), say it (`ctx`: the job's log), and refuse a run the device cannot hold, naming what to lower.
    `weights`: the target's parameter bytes (counted as held even where they are mapped and not read
    yet). Returns the estimate for run.json."""
    shapes = Shapes(
        batch_size=params.batch_size,
        eval_batch_size=max(1, min(params.eval_batch_size, heldout_rows)),
        longest=longest,
        anchors_per_forward=min(params.anchors_per_forward, params.anchors_per_seq),
        block_size=kind.slots,
        backend=backend,
        gradient_checkpointing=params.gradient_checkpointing,
        element_size=element_size(device),
        kl=params.mix.needs_teacher,
        state_shards=state_shards,
        optimizer=params.optimizer,
    )
    capacity = capacity_bytes(device, sharing=sharing)
    held = in_use_bytes(device) + resident_weights_gap(device, weights)
    est: MemoryEstimate = kind.estimate(shapes, target_config, held=held, capacity=capacity)
    if ctx is not None:
        ctx.event("info", f"memory: {est.describe()}; attention {backend}, rows up to {longest} tokens")
    if enforce and not est.fits:
        raise DeviceError(too_big(est))
    return est.to_dict()


def too_big(est: MemoryEstimate) -> str:
    return (
        f"this run needs {est.describe()}: lower batch_size (raise grad_accum to keep the global batch),"
        " anchors_per_forward, seq_length or eval_batch_size, or set gradient_checkpointing"
        " (memory_check false runs it anyway)"
    )
