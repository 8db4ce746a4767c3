"""A DFlash run's working set (draftdeck.drafter.train.memory asks it before step 1). Terms, in bytes
(e: the activation dtype's size, 4 on the CPU, 2 under bf16):

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
"""

from __future__ import annotations

from torch import nn

from draftdeck.drafter.model.attention import SCORE_CHUNK_BYTES
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.head import rows_per_chunk
from draftdeck.drafter.train.memory import MemoryEstimate, Shapes
from draftdeck.drafter.train.optimizers import state_bytes
from draftdeck.drafter.train.truth import HEAD_ELEMENTS

HELDOUT_ANCHORS_PER_CHUNK = 256  # the held-out pass's chunk of anchors (walked.heldout_pass)


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
    # float32 gradient + the optimizer's state (AdamW's two moments; Muon's one buffer)
    optimizer = (n_params * 4 + state_bytes(drafter, shapes.optimizer)) // shapes.state_shards

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
