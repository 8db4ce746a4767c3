"""An EAGLE-3 run's working set (draftdeck.drafter.train.memory asks it before step 1)."""

from __future__ import annotations

from torch import nn

from draftdeck.drafter.kinds.eagle3.model import Eagle3Config
from draftdeck.drafter.train.memory import MemoryEstimate, Shapes
from draftdeck.drafter.train.optimizers import state_bytes


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
    optimizer = (n_params * 4 + state_bytes(drafter, shapes.optimizer)) // shapes.state_shards

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
