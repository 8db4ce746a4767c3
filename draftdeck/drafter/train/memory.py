"""Know before you run: the peak memory a training run will need, from its shapes.

The estimate is what the run holds once the target and the drafter are loaded (measured: the
process's RSS on the CPU, allocated memory on a GPU), plus the drafter's gradients and AdamW state,
plus the larger of a training micro-batch's working set and a held-out batch's, at the longest row
the run reads. Terms, in bytes (e: the activation dtype's size, 4 on the CPU, 2 under bf16):

- target forward (no grad): every layer's hidden state of the micro-batch (HF keeps them all for
  `output_hidden_states`) and one layer's MLP;
- context: the concatenated target features and the drafter's fc/norm of them, and every layer's
  context keys and values (computed once per micro-batch, `objective.dflash_backward`);
- drafter layers: what autograd keeps per layer for Q = batch x anchors per forward x B queries
  (with `gradient_checkpointing` only each layer's input, plus one layer);
- attention: the backend's working set (a chunk of scores for blocked; the dense mask for dense);
- LM head: one chunk of float32 logits (all counted slots' logits for the unchunked reference); with
  the target's distribution (a KL loss, every held-out pass), three thirds of a chunk and its hidden
  states.

`tests/unit/drafter/train/test_memory.py` checks it against a measured peak (within 30 %).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from draftdeck.drafter.model.attention import SCORE_CHUNK_BYTES, Backend
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.eagle3 import Eagle3Config
from draftdeck.drafter.model.head import rows_per_chunk
from draftdeck.drafter.train.device import DeviceError, capacity_bytes, in_use_bytes, resident_weights_gap
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.truth import HEAD_ELEMENTS
from draftdeck.jobs.context import RunContext
from draftdeck.units import binary_size

HELDOUT_ANCHORS_PER_CHUNK = 256  # draftdeck.drafter.train.walked.heldout_pass's chunk of anchors


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
    state_shards: int = 1  # ranks the drafter's gradients and AdamW state are split over (fsdp)


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


def estimate(
    cfg: DrafterConfig,
    target_config: object,
    drafter: nn.Module,
    shapes: Shapes,
    *,
    held: int,
    capacity: int | None,
) -> MemoryEstimate:
    """The run's peak (see the module docstring); `held`: bytes in use now, weights loaded."""
    e, t, b = shapes.element_size, shapes.longest, shapes.block_size
    h, inter, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    layers_t = int(getattr(target_config, "num_hidden_layers", cfg.num_target_layers))
    inter_t = int(getattr(target_config, "intermediate_size", inter))
    kv = cfg.num_key_value_heads * cfg.head_dim
    heads = cfg.num_attention_heads
    n_params = sum(p.numel() for p in drafter.parameters())
    optimizer = n_params * 4 * 3 // shapes.state_shards  # float32 gradient + AdamW's two moments

    def target(bsz: int) -> int:
        return bsz * t * e * (h * (layers_t + 1) + 3 * inter_t)

    def context(bsz: int) -> int:  # the target's features, the drafter's fc and norm of them
        return bsz * t * e * (len(cfg.target_layer_ids) * h + 3 * h)

    def attention(bsz: int, q: int, grad: bool) -> int:
        if shapes.backend == "dense":  # the boolean mask, and the keys and values put together
            work = bsz * q * (t + q) + 2 * bsz * (t + q) * kv * e
        elif shapes.backend == "blocked":  # a chunk's scores and their exp (twice, in the backward)
            work = (3 if grad else 2) * min(SCORE_CHUNK_BYTES, bsz * heads * q * t * 4)
        else:
            work = bsz * heads * q * 4
        if grad:  # float32 dq, and the context's and blocks' dk, dv
            work += 4 * bsz * (q * heads * cfg.head_dim + 2 * (t + q) * kv)
        return work

    def head(slots: int, grad: bool, teacher: bool) -> int:
        if not teacher:
            logits = min(rows_per_chunk(vocab), slots) * vocab * 4  # one chunk; the softmax in place
            return logits + slots * h * e * (2 if grad else 1)
        # a third of a chunk of slots: the drafter's logits, the target's log-probs, its probabilities
        logits = 3 * min(rows_per_chunk(vocab) // 3 or 1, slots) * vocab * 4
        return logits + slots * h * e * (3 if grad else 2)  # + the target's hidden state per slot

    # a training micro-batch: the context's keys and values once, then groups of anchors
    bsz = shapes.batch_size
    q = bsz * min(shapes.anchors_per_forward, t) * b
    per_layer = e * (12 * q * h + 8 * q * kv + 5 * q * inter)
    if shapes.gradient_checkpointing:
        drafter_act = cfg.layers * q * h * e + per_layer
    else:
        drafter_act = cfg.layers * per_layer
    train = {
        "optimizer": optimizer,
        "target forward": target(bsz),
        "context": context(bsz),
        # per layer: the projections, norm and rotary of the context's keys, its values, and the
        # detached copies' gradients
        "context keys and values": cfg.layers * bsz * t * kv * (8 * e + 4 * 4),
        "drafter layers": drafter_act + per_layer // 2,  # + the backward's transient gradients
        "attention": attention(bsz, q // bsz, True),
        "LM head": head(q, True, shapes.kl),
    }
    # a held-out batch: no gradients, anchors in chunks, the context's keys and values per layer
    ebsz = max(1, shapes.eval_batch_size)
    qe = ebsz * min(HELDOUT_ANCHORS_PER_CHUNK, t) * b
    walk = {  # the drafter over a chunk of anchors
        "drafter layers": e * (4 * qe * h + 2 * qe * kv + 3 * qe * inter),
        "attention": attention(ebsz, qe // ebsz, False),
        "LM head": head(qe, False, True),  # the expected acceptance per slot reads the target's
    }
    # after the walk, the target's view of the data (draftdeck.drafter.train.truth): a chunk of its
    # logits, softmaxed; the larger of the two counts
    agreement = 2 * 4 * min(HEAD_ELEMENTS, ebsz * t * vocab)
    heldout = {
        "optimizer": optimizer,
        "target forward": target(ebsz),
        "context": context(ebsz),
        "context keys and values": ebsz * t * kv * 4 * e,
        **(walk if sum(walk.values()) >= agreement else {"target agreement": agreement}),
    }
    phases = {"training step": held + sum(train.values())}
    if shapes.eval_batch_size:  # 0: the run has no held-out pass
        phases["held-out pass"] = held + sum(heldout.values())
    phase = max(phases, key=lambda k: phases[k])
    return MemoryEstimate(held, train if phase == "training step" else heldout, phase, capacity, phases)


def estimate_eagle3(
    cfg: Eagle3Config,
    target_config: object,
    drafter: nn.Module,
    shapes: Shapes,
    steps: int,
    *,
    held: int,
    capacity: int | None,
) -> MemoryEstimate:
    """An EAGLE-3 run's peak: training-time test runs every position of a row `steps` times, and
    autograd keeps every step: its layer's activations, its attention's probabilities over the row
    (a (T, T) tile per head, chunked in the forward, all kept for the backward) and its logits over the
    draft vocabulary of N ids; the target's view over the draft vocabulary once per micro-batch."""
    e, t = shapes.element_size, shapes.longest
    h, inter, n = cfg.hidden_size, cfg.intermediate_size, cfg.draft_vocab_size
    kv, heads = cfg.num_key_value_heads * cfg.head_dim, cfg.num_attention_heads
    layers_t = int(getattr(target_config, "num_hidden_layers", cfg.num_target_layers))
    inter_t = int(getattr(target_config, "intermediate_size", inter))
    n_params = sum(p.numel() for p in drafter.parameters())
    optimizer = n_params * 4 * 3 // shapes.state_shards

    def target(bsz: int) -> int:
        return bsz * t * e * (h * (layers_t + 1) + 3 * inter_t)

    def per_step(bsz: int, grad: bool) -> int:
        q = bsz * t
        layer = e * (14 * q * h + 8 * q * kv + 5 * q * inter) if grad else e * (4 * q * h + 3 * q * inter)
        tile = t if grad else min(t, 512)  # the backward keeps every chunk's probabilities
        return layer + bsz * heads * tile * (t + steps) * (4 + e) + q * n * 4 * (2 if grad else 1)

    bsz, ebsz = shapes.batch_size, max(1, shapes.eval_batch_size)
    view = 2 * 4 * n  # the target's log-probabilities and probabilities over the draft ids, per position
    train = {
        "optimizer": optimizer,
        "target forward": target(bsz),
        "context": bsz * t * e * (3 * cfg.target_hidden_size + (steps + 2) * h),
        "target's view": bsz * t * view,
        "TTT steps": steps * per_step(bsz, True),
    }
    heldout = {
        "optimizer": optimizer,
        "target forward": target(ebsz),
        "context": ebsz * t * e * (3 * cfg.target_hidden_size + (steps + 2) * h),
        "target's view": ebsz * t * view,
        "TTT steps": per_step(ebsz, False) + steps * ebsz * t * h * e,
    }
    phases = {"training step": held + sum(train.values())}
    if shapes.eval_batch_size:
        phases["held-out pass"] = held + sum(heldout.values())
    phase = max(phases, key=lambda k: phases[k])
    return MemoryEstimate(held, train if phase == "training step" else heldout, phase, capacity, phases)


def element_size(device: torch.device) -> int:
    return 2 if device.type == "cuda" else 4


def check_memory(
    cfg: DrafterConfig | Eagle3Config,
    target_config: object,
    drafter: nn.Module,
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
    """Estimate the run's peak before step 1, say it (`ctx`: the job's log), and refuse a run the
    device cannot hold, naming what to lower. `weights`: the target's parameter bytes (counted as
    held even where they are mapped and not read yet). Returns the estimate for run.json."""
    shapes = Shapes(
        batch_size=params.batch_size,
        eval_batch_size=max(1, min(params.eval_batch_size, heldout_rows)),
        longest=longest,
        anchors_per_forward=min(params.anchors_per_forward, params.anchors_per_seq),
        block_size=cfg.block_size if isinstance(cfg, DrafterConfig) else params.ttt_steps + 1,
        backend=backend,
        gradient_checkpointing=params.gradient_checkpointing,
        element_size=element_size(device),
        kl=params.mix[1] > 0,
        state_shards=state_shards,
    )
    capacity = capacity_bytes(device, sharing=sharing)
    held = in_use_bytes(device) + resident_weights_gap(device, weights)
    if isinstance(cfg, DrafterConfig):
        est = estimate(cfg, target_config, drafter, shapes, held=held, capacity=capacity)
    else:
        est = estimate_eagle3(
            cfg, target_config, drafter, shapes, params.ttt_steps, held=held, capacity=capacity
        )
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
