"""The optimizer a run steps (`--optimizer`): AdamW over every parameter, or Muon with AdamW.

`muon`: PyTorch's own `torch.optim.Muon` (momentum 0.95, Nesterov, 5 Newton-Schulz steps) over the
2-D weight matrices of the drafter's hidden layers (its decoder layers; EAGLE-3's one layer), AdamW
over the rest: the embedding, the LM head and the projection of the target's features into the
drafter (matrices indexed by token or feature, not mixing a hidden state; the Muon paper and
speculators keep them on AdamW), norms and biases. Muon's step is scaled to match AdamW's update size
(`adjust_lr_fn="match_rms_adamw"`, Moonshot's rule), so one `--lr` and one schedule serve both.
Muon keeps one float32 momentum buffer per parameter, AdamW two moments: `state_bytes` counts them
for the memory check and the planner.

The two optimizers step together behind one object (`Optimizers`), and their schedules with them
(`Schedules`); checkpoints hold both in one state dict keyed by parameter name
(`draftdeck.drafter.train.sharding.full_state`), so a run resumes on any number of ranks. Under fsdp
the parameters are DTensors: Muon's Newton-Schulz iteration runs on them as on whole matrices (its
matmuls and norm are DTensor ops, each a collective), so the update is the unsharded one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from torch import nn

OptimizerName = Literal["adamw", "muon"]
MUON_MOMENTUM = 0.95
ADAMW_STATE_BYTES = 8  # two float32 moments per parameter
MUON_STATE_BYTES = 4  # one float32 momentum buffer per parameter


def hidden_layers(drafter: nn.Module) -> list[nn.Module]:
    """The drafter's hidden layers: a DFlash-like drafter's decoder layers, EAGLE-3's one layer."""
    layers = getattr(drafter, "decoder_layers", None)
    if layers is None:
        layers = [m for m in (getattr(drafter, "midlayer", None),) if m is not None]
    return list(layers)


def split_for_muon(drafter: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(Muon's parameters, AdamW's): the trainable 2-D matrices of the hidden layers (both sides > 1)
    go to Muon, every other trainable parameter to AdamW."""
    in_layers = {id(p) for layer in hidden_layers(drafter) for p in layer.parameters()}
    muon: list[nn.Parameter] = []
    adamw: list[nn.Parameter] = []
    for p in drafter.parameters():
        if not p.requires_grad:
            continue
        matrix = p.ndim == 2 and min(p.shape) > 1
        (muon if matrix and id(p) in in_layers else adamw).append(p)
    return muon, adamw


def state_bytes(drafter: nn.Module, name: OptimizerName) -> int:
    """Bytes of the optimizer's state for the whole drafter (float32), before any sharding."""
    if name == "adamw":
        return ADAMW_STATE_BYTES * sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    muon, adamw = split_for_muon(drafter)
    return MUON_STATE_BYTES * sum(p.numel() for p in muon) + ADAMW_STATE_BYTES * sum(p.numel() for p in adamw)


class Optimizers:
    """One or two optimizers stepped together: what the trainer calls `opt`."""

    def __init__(self, parts: list[torch.optim.Optimizer]):
        self.parts = parts

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for part in self.parts for g in part.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        return {k: v for part in self.parts for k, v in part.state.items()}

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)


def build(drafter: nn.Module, name: OptimizerName, lr: float, weight_decay: float) -> Optimizers:
    """The run's optimizers over `drafter` (see the module docstring)."""
    if name == "adamw":
        return Optimizers([torch.optim.AdamW(drafter.parameters(), lr=lr, weight_decay=weight_decay)])
    muon, adamw = split_for_muon(drafter)
    parts: list[torch.optim.Optimizer] = []
    if muon:
        parts.append(
            torch.optim.Muon(
                muon, lr=lr, weight_decay=weight_decay, momentum=MUON_MOMENTUM, adjust_lr_fn="match_rms_adamw"
            )
        )
    if adamw:
        parts.append(torch.optim.AdamW(adamw, lr=lr, weight_decay=weight_decay))
    return Optimizers(parts)


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup to 1 over `warmup` steps, then cosine down to `min_ratio` at `total`."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class Schedules:
    """One LR schedule per optimizer, the same factor for each."""

    def __init__(self, opt: Optimizers, factor: Callable[[int], float]):
        self.parts = [torch.optim.lr_scheduler.LambdaLR(part, factor) for part in opt.parts]

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def state_dict(self) -> Any:
        """One optimizer: its schedule's state as an AdamW run always wrote it; else a list."""
        states = [part.state_dict() for part in self.parts]
        return states[0] if len(states) == 1 else states

    def load_state_dict(self, state: Any) -> None:
        states = state if isinstance(state, list) else [state]
        if len(states) != len(self.parts):
            raise ValueError(f"{len(states)} schedules saved for {len(self.parts)} optimizers")
        for part, saved in zip(self.parts, states, strict=True):
            part.load_state_dict(saved)

    def __iter__(self) -> Iterator[torch.optim.lr_scheduler.LRScheduler]:
        return iter(self.parts)
