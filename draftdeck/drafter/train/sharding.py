"""How a run spreads the drafter over its ranks (`--sharding`).

- `none`: one process holds everything (the one choice for one rank);
- `ddp`: every rank holds the whole drafter; gradients are all-reduced layer by layer as the
  backward produces them (PyTorch's `replicate`: data parallelism on FSDP2's hooks, whose per-layer
  reduction overlaps the backward and follows methods other than `forward`, which training's
  flattened blocks use);
- `fsdp`: FSDP2 (`fully_shard`) per drafter layer and over the whole drafter: parameters, gradients
  and AdamW state are 1/N per rank; a layer's weights are gathered for its forward and its backward.
  On a GPU the gathered weights are bf16 and gradients are reduced in float32.

Under fsdp the frozen target is sharded too (`shard_target`), so that a target larger than one
device trains across N: its decoder layers by FSDP2 (per layer, gathered for its forward and freed
after it), its embedding and LM head by vocabulary (`draftdeck.drafter.model.vocab_parallel`: the
drafter reads them at every slot of every step, so FSDP would hold them whole for the whole step).
Each target forward, and each use of the head and embedding, is then a collective, so every rank
must make the same calls: training steps do (each micro-batch's anchors padded to the same number
of groups); the pre-flight and the held-out pass, which split their rows across ranks, run every
row on every rank instead (the trainer's `eval_ranks`, under `Target.same_rows`), and generation
steps until every rank is done.

Training calls the drafter through `context_kv` and `block_forward` (several backward passes per
micro-batch, `objective.dflash_backward`), so those are registered as forward methods. Gradients are
summed, not averaged: the loss's normaliser is already the global batch's weight sum. The held-out
pass and the checkpoints see the whole drafter: `full_state` gathers it (a collective: every rank
calls it); `eval_copy` is an unsharded copy for the held-out pass, whose batches differ in number
across ranks (no collective may run inside it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from draftdeck.drafter.model.target import Target
from draftdeck.drafter.model.vocab_parallel import shard_vocab
from draftdeck.errors import UsageError

Sharding = Literal["none", "ddp", "fsdp"]
STRATEGIES: tuple[Sharding, ...] = ("none", "ddp", "fsdp")
# the drafter's methods that training calls instead of `forward` (a sharded module gathers for them)
LAYER_METHODS = ("context_keys_values", "block_forward")
ROOT_METHODS = ("context_kv", "block_forward")


def choose_sharding(
    requested: str, world: int, ddp_fits: bool | None = None, fsdp_refused: str | None = None
) -> tuple[Sharding, str]:
    """The strategy a run uses and why. `ddp_fits`: the planner's verdict on a replicated drafter
    (None: not known, ddp); `fsdp_refused`: why the drafter's kind cannot train under fsdp."""
    if fsdp_refused and (requested == "fsdp" or (requested == "auto" and world > 1 and ddp_fits is False)):
        why = "the run does not fit on one device replicated, and " if requested == "auto" else ""
        raise UsageError(
            f"sharding fsdp: {why}this drafter kind cannot shard: {fsdp_refused} (use ddp or none)"
        )
    if world == 1:
        if requested in ("ddp", "fsdp"):
            raise UsageError(f"sharding {requested} needs more than one rank (devices > 1)")
        return "none", "one rank"
    if requested == "none":
        raise UsageError("sharding none holds the run in one process: with devices > 1 use ddp or fsdp")
    if requested != "auto":
        return requested, "asked for"  # type: ignore[return-value]
    if ddp_fits is False:
        return "fsdp", "the whole target and drafter with its AdamW state do not fit on one device: sharded"
    if ddp_fits is None:
        return "ddp", "the device's size is unknown, so replicated; draftdeck plan --device-memory checks it"
    return "ddp", "the whole drafter and its AdamW state fit on every rank: replicated, less communication"


def shard(drafter: Any, strategy: Sharding, device: torch.device, world: int) -> None:
    """Wrap `drafter` in place for `strategy` over `world` ranks (none: nothing to do): each of its
    `decoder_layers`, then the whole (a kind whose drafter shards its state has them)."""
    if strategy == "none":
        return
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    # training's outputs are used out of place (detached, added): FSDP2's warning about in-place ops
    # on a returned view does not apply
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mesh = init_device_mesh(device.type, (world,))
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if device.type == "cuda"
        else MixedPrecisionPolicy()
    )
    wrap: Any = fully_shard if strategy == "fsdp" else replicate
    for layer in drafter.decoder_layers:
        wrap(layer, mesh=mesh, mp_policy=mp)
        for name in LAYER_METHODS:
            register_fsdp_forward_method(layer, name)
    wrap(drafter, mesh=mesh, mp_policy=mp)
    for name in (*ROOT_METHODS, *getattr(drafter, "fsdp_methods", ())):  # a kind's heads read root weights
        register_fsdp_forward_method(drafter, name)
    for module in (*drafter.decoder_layers, drafter):  # each sharded module reduces its own gradients
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # gloo: no PREMUL_SUM


def target_layers(model: nn.Module) -> list[nn.Module]:
    """A causal LM's decoder layers: the module list named `...layers` with one per hidden layer."""
    config: Any = model.config
    n = int(config.get_text_config().num_hidden_layers)
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.endswith("layers") and len(module) == n:
            return list(module)
    raise UsageError(f"{type(model).__name__}: no list of {n} decoder layers to shard (sharding fsdp)")


def shard_target(target: Target, device: torch.device, rank: int, world: int) -> str:
    """Shard the frozen target over `world` ranks: its decoder layers by FSDP2 (per layer, resharded
    after each forward), its embedding and LM head by vocabulary (`vocab_parallel`); its norms stay
    whole. Returns what was sharded, in words."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for layer in target_layers(target.model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    target.sharded = True
    target.vocab = shard_vocab(target.model, rank, world)
    if target.vocab is None:
        return "decoder layers sharded; embedding and head whole (not a plain embedding and bias-free head)"
    return "decoder layers sharded; embedding and head split by vocabulary"


def _options(*, cpu_offload: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)


def full_state(
    drafter: nn.Module, opt: Sequence[torch.optim.Optimizer], strategy: Sharding
) -> tuple[dict, dict]:
    """(model, optimizer) state dicts of the whole drafter, on the CPU, keyed by parameter name
    (the optimizers' together, `optimizers.Optimizers.parts`, so that a run resumes on any number of
    ranks and any strategy). Sharded: a collective every rank calls; rank 0 gets the tensors, the
    others empty dicts."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if strategy == "none":
        model = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
        _, optim = get_state_dict(drafter, opt, options=_options(cpu_offload=False))
        return model, optim
    return get_state_dict(drafter, opt, options=_options(cpu_offload=True))


def load_state(drafter: nn.Module, opt: Sequence[torch.optim.Optimizer], model: dict, optim: dict) -> None:
    """Load whole state dicts (`full_state`'s, from any world size) into this rank's part. An
    optimizer state keyed by parameter index (checkpoints written before sharding, AdamW alone)
    loads as it was written, into an unsharded drafter."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    by_index = any(isinstance(k, int) for k in optim.get("state", {}))
    set_state_dict(
        drafter, opt, model_state_dict=model, optim_state_dict={} if by_index else optim,
        options=_options(cpu_offload=False),
    )  # fmt: skip
    if by_index:
        opt[0].load_state_dict(optim)


def eval_copy(
    drafter: nn.Module, strategy: Sharding, device: torch.device, fresh: Callable[[], nn.Module]
) -> nn.Module:
    """The drafter for the held-out pass: itself unsharded; else a whole copy on every rank
    (a collective), so that ranks with different numbers of held-out batches never wait on each
    other."""
    if strategy == "none":
        return drafter
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(drafter, options=_options(cpu_offload=False))
    copy = fresh().to(device)  # `fresh`: an unsharded drafter of the same config
    copy.load_state_dict(state)
    copy.eval()
    return copy


def local_bytes(tensors: Any) -> int:
    """Bytes this rank holds of `tensors` (a sharded tensor counts its local shard)."""
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def state_bytes(drafter: nn.Module, opt: Any) -> dict[str, int]:
    """This rank's drafter state: weights, gradients and optimizer moments (`opt`: an optimizer or
    the run's `Optimizers`), in bytes."""
    params = list(drafter.parameters())
    return {
        "weights": local_bytes(params),
        "gradients": local_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": local_bytes(v for s in opt.state.values() for v in s.values() if v.dim() > 0),
    }


def as_float(value: torch.Tensor) -> float:
    """A reduced scalar as a float (a sharded norm is a DTensor: its full value)."""
    full = value.full_tensor() if hasattr(value, "full_tensor") else value
    return float(full)
