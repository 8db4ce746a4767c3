"""Will it fit? Per-rank peak memory of a training run for each sharding, from config.json alone.

The target's language model and the drafter are built on the meta device (shapes, no weights), so
a 27B target plans in a second on a laptop. Per rank, in bytes (n: the drafter's trainable
parameters, N: ranks, e: the compute dtype's size, 2 for bf16 (a GPU run, autocast), 4 for
float32 (a CPU run)):

- target weights: every target parameter at e; fsdp: the target is sharded
  (`draftdeck.drafter.train.sharding.shard_target`): its decoder layers / N and two in flight (the
  one computing and the one prefetched), its embedding and head split by vocabulary (/ N), its
  norms whole;
- drafter weights: what the drafter computes with: n at e (bf16: autocast's copy of the float32
  weights); fsdp: the two layers in flight (gathered, the one computing and the one prefetched);
- master copy: the float32 weights the optimizer updates (the weights themselves in float32, so
  0 there); fsdp: n x 4 / N;
- gradients (float32) and optimizer state (AdamW's two float32 moments; with `--optimizer muon`,
  Muon's one for the hidden layers' matrices): n x 4 and n x 8 (Muon's: 4 each), /N under fsdp;
- activations and LM-head chunk: the larger of a training micro-batch's and a held-out batch's
  working set (`draftdeck.drafter.train.memory.estimate`) at `seq_length` tokens;
- communication buffers: ddp all-reduces one layer's float32 gradients at a time; fsdp
  reduce-scatters one layer's (input and output), and the split head gathers every rank's rows of
  one head call (hidden states, their gradient, the target's with a KL: N x slots x H x 4);
- runtime: what a process holds before any tensor (CUDA context and allocator slack on a GPU; the
  interpreter and the libraries on the CPU).

An EAGLE-3 drafter (`drafter="eagle3"`, one layer over a draft vocabulary) stays whole on every
rank under either sharding, its gradients summed parameter by parameter
(`draftdeck.drafter.train.drafters.Eagle3Kind`): its weights, master copy, gradients and AdamW
state are never divided; fsdp shards the target alone. Its working set is training-time test's
(`draftdeck.drafter.train.memory.estimate_eagle3`: every TTT step's attention tile over the row and
its draft-vocabulary logits, kept for the backward), the target's view over the draft vocabulary
standing as its LM-head term; its communication, one parameter's float32 gradient in flight and
under fsdp the split head's gathered rows and logits of one call of that view.

A run from a hidden-state cache (`cached`: train --hidden-states, draftdeck.drafter.model.cached_target)
holds of the target its embedding and LM head alone (once when tied), its decoder layers and final
norm not loaded; it does not shard (no fsdp column: there are no decoder layers to split). The cache's
disk (`CacheDisk`) is rows x tokens x stored layers x hidden x bytes.

`tests/unit/drafter/train/test_plan.py` checks the parameter counts by hand arithmetic;
`benchmarks/train_sharded.py` measures the per-rank peak against this figure.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from draftdeck.causal_lm import causal_lm_config
from draftdeck.drafter.kinds import get_kind
from draftdeck.drafter.model.loss_terms import parse_mix
from draftdeck.drafter.train.device import capacity_bytes
from draftdeck.drafter.train.memory import MemoryEstimate, Shapes
from draftdeck.drafter.train.optimizers import OptimizerName, state_bytes
from draftdeck.drafter.train.params import PlanParams, TrainParams
from draftdeck.drafter.train.sharding import STRATEGIES, Sharding, target_layers
from draftdeck.errors import UsageError
from draftdeck.units import binary_size

if TYPE_CHECKING:
    from draftdeck.drafter.train.cache.size import Projection as CacheDisk

# Measured: a CUDA context and the caching allocator's slack (H100, PyTorch 2.x) is about 1 GiB; on
# the CPU a training process's RSS before its first tensor (Python, torch, transformers) is about
# 0.7 GiB.
RUNTIME_BYTES = {2: 2**30, 4: 700 * 2**20}
LARGEST_BATCH = 4096
TERMS = (
    "target weights",
    "drafter weights",
    "master copy",
    "gradients",
    "optimizer state",
    "activations",
    "LM-head chunk",
    "communication buffers",
    "runtime",
)


@dataclass(frozen=True)
class Shape:
    """What a run's memory depends on: the train job's shape options and the world."""

    layers: int = 1
    block_size: int = 16
    seq_length: int = 4096
    batch_size: int = 1
    eval_batch_size: int = 8  # 0: no held-out pass
    anchors_per_seq: int = 512
    anchors_per_forward: int = 32
    gradient_checkpointing: bool = False
    kl: bool = True  # the default loss (ce+kl) reads the target's distribution
    element_size: int = 2  # 2: bf16 (a GPU run), 4: float32 (a CPU run)
    world: int = 1
    target_layer_ids: tuple[int, ...] | None = None
    drafter: str = "dflash"  # or "eagle3": its own shape below
    ttt_steps: int = 7
    mtp_steps: int = 3  # MTP's unrolled steps
    draft_vocab_size: int | None = None  # None: the kind's default (at most the target's vocabulary)
    eagle3_layer_ids: tuple[int, ...] | None = None
    optimizer: OptimizerName = "adamw"  # or "muon": one state buffer for the layers' matrices, not two
    cached: bool = False  # from a hidden-state cache: the target's embedding and head alone, no fsdp


# why a run from a hidden-state cache has no fsdp (the trainer's choose_sharding and the plan's auto)
CACHED_NO_FSDP = "a run from a hidden-state cache holds no target decoder layers for fsdp to shard"


def fsdp_refused(drafter: str, cached: bool) -> str | None:
    """Why a run of this kind, from a cache or not, cannot train under fsdp (None: it can)."""
    return get_kind(drafter).fsdp_refused or (CACHED_NO_FSDP if cached else None)


@dataclass
class StrategyPlan:
    terms: dict[str, int]
    capacity: int | None
    largest_batch: int  # 0: not even one sequence
    phase: str  # what sets the peak: "training step" or "held-out pass"

    @property
    def per_rank(self) -> int:
        return sum(self.terms.values())

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.per_rank <= self.capacity

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_rank_bytes": self.per_rank,
            "fits": self.fits,
            "largest_batch": self.largest_batch,
            "peak_in": self.phase,
            "terms": dict(self.terms),
        }


@dataclass
class Plan:
    target: str  # the target's class
    target_params: int
    trainable_params: int
    drafter_layers: int
    drafter: str  # "dflash" or "eagle3"
    draft_vocab_size: int | None  # EAGLE-3's draft vocabulary (capped at the target's); DFlash: None
    shape: Shape
    capacity: int | None
    strategies: dict[str, StrategyPlan] = field(default_factory=dict)
    config_from: str | None = None  # a bundled target's config: which (draftdeck.drafter.train.targets)
    # when nothing fits: what would (draftdeck.drafter.train.plan_advice.Advice), each alone
    advice: list[Any] = field(default_factory=list)
    cache_disk: CacheDisk | None = None  # from a cache: what the cache of its rows takes on disk

    @property
    def fits(self) -> bool:
        """Whether some sharding fits the devices (always, when their size is unknown)."""
        return any(s.fits for s in self.strategies.values())

    @property
    def auto(self) -> tuple[Sharding, str]:
        """What `--sharding auto` picks for this world, and why."""
        from draftdeck.drafter.train.sharding import choose_sharding

        if self.shape.world == 1:
            return choose_sharding("auto", 1)
        fits = None if self.capacity is None else self.strategies["ddp"].fits
        if fits is False and "fsdp" not in self.strategies:  # the kind cannot shard: no strategy fits
            refused = fsdp_refused(self.drafter, self.shape.cached)
            what = "run" if self.shape.cached else "kind"
            return "ddp", f"does not fit replicated, and fsdp cannot train this {what}: {refused}"
        return choose_sharding("auto", self.shape.world, fits)

    def to_dict(self) -> dict[str, Any]:
        name, why = self.auto
        return {
            "target": self.target,
            "target_params": self.target_params,
            "trainable_params": self.trainable_params,
            "drafter": self.drafter,
            "draft_vocab_size": self.draft_vocab_size,
            "world": self.shape.world,
            "device_memory_bytes": self.capacity,
            "strategies": {k: v.to_dict() for k, v in self.strategies.items()},
            "auto": {"strategy": name, "why": why},
            "config_from": self.config_from,
            "fits": self.fits,
            "advice": [a.to_dict() for a in self.advice],
            "hidden_states": None if not self.shape.cached else {
                "target_weights": "embedding and LM head (decoder layers from the cache)",
                "cache_disk": self.cache_disk.to_dict() if self.cache_disk else None,
            },
        }  # fmt: skip


def resolve_target(text: str | Path) -> tuple[Path, str | None]:
    """The model folder or config.json a plan reads for `text`, and for a bundled target's name (a
    path that does not exist, named as a bundled target is: draftdeck.drafter.train.targets) which
    config it is."""
    from draftdeck.drafter.train import targets

    path = Path(text)
    if path.exists():
        return path, None
    found = targets.bundled(str(text))
    if found is None:
        raise UsageError(
            f"{path}: no such folder or config.json, and no bundled target of that name (bundled, their"
            f" config.json alone: {', '.join(targets.names())})"
        )
    return found, targets.described(found)


def target_config(path: str | Path) -> Any:
    """The target's language-model config from a model folder, a config.json file or a bundled
    target's name (`resolve_target`)."""
    path, _ = resolve_target(path)
    if path.is_file():  # a config alone: read it as the folder it came from would be
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copyfile(path, Path(tmp) / "config.json")
            return causal_lm_config(tmp)
    if not (path / "config.json").is_file():
        raise UsageError(f"{path}: no config.json (give a model folder or its config.json)")
    return causal_lm_config(path)


@dataclass(frozen=True)
class PlannedDrafter:
    """A drafter as the plan counts it (its kind's `plan`, built on the meta device)."""

    cfg: Any
    model: Any
    trainable: int  # its trainable parameters
    layer: int  # the largest unit gathered or reduced at a time: a layer (EAGLE-3: its largest parameter)
    layers: int  # decoder layers
    draft_vocab_size: int | None  # a draft vocabulary's size (capped at the target's); None: the target's
    shards_state: bool  # under fsdp its weights, gradients and AdamW state are split over the ranks
    working: Callable[[Shapes], MemoryEstimate]  # a training micro-batch's and a held-out batch's peak
    fsdp_head: Callable[[Shape, int], int]  # bytes in flight for the target's head under fsdp, on N ranks


@dataclass(frozen=True)
class _Models:
    """The target and the drafter as the plan counts them (built on the meta device)."""

    config: Any  # the target's language-model config
    drafter: PlannedDrafter
    target_params: int
    target_layers: int  # the target's decoder layers' parameters
    target_layer: int  # ... the largest one's
    target_vocab: int  # its embedding's and LM head's (once when tied): split by vocabulary under fsdp


def meta_count(build: Callable[[], Any]) -> tuple[int, Any]:
    """(parameters, module) of `build()` on the meta device: shapes, no weights."""
    with torch.device("meta"):
        module = build()
    return sum(p.numel() for p in module.parameters()), module


@dataclass(frozen=True)
class CountedTarget:
    """A target as the plan counts it, once (built on the meta device): what every shape shares."""

    name: str  # its class
    config: Any  # its language model's config
    params: int
    layers: int  # its decoder layers' parameters
    layer: int  # ... the largest one's
    vocab: int  # its embedding's and LM head's (once when tied)


def count_target(config: Any) -> CountedTarget:
    from transformers import AutoModelForCausalLM

    params, target = meta_count(lambda: AutoModelForCausalLM.from_config(config))
    per_layer = [sum(p.numel() for p in lay.parameters()) for lay in target_layers(target)]
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    vocab = emb.weight.numel() + (0 if head.weight is emb.weight else head.weight.numel())
    # a checkpoint with a vision tower: its language model's config
    return CountedTarget(
        type(target).__name__, config.get_text_config(), params, sum(per_layer), max(per_layer), vocab
    )


def plan(config: Any, shape: Shape, capacity: int | None) -> Plan:
    """Every strategy's per-rank terms for `shape` on devices of `capacity` bytes (None: unknown)."""
    return plan_counted(count_target(config), shape, capacity)


def plan_counted(
    target: CountedTarget, shape: Shape, capacity: int | None, *, batches: bool = True,
    drafter: PlannedDrafter | None = None,
) -> Plan:  # fmt: skip
    """`plan` of a target counted once; `batches` False: the largest batch is not searched (0);
    `drafter`: the drafter planned for this shape already (it does not depend on the world)."""
    if drafter is None:
        drafter = get_kind(shape.drafter).plan(shape, target.config)
    models = _Models(target.config, drafter, target.params, target.layers, target.layer, target.vocab)
    result = Plan(
        target.name, target.params, drafter.trainable, drafter.layers, shape.drafter,
        drafter.draft_vocab_size, shape, capacity,
    )  # fmt: skip
    refused = fsdp_refused(shape.drafter, shape.cached)  # a run that cannot shard: no fsdp column
    for name in [s for s in STRATEGIES if s != "fsdp" or not refused] if shape.world > 1 else ["none"]:
        terms, phase = _terms(name, models, shape)
        largest = _largest_batch(name, models, shape, capacity) if batches else 0
        result.strategies[name] = StrategyPlan(terms, capacity, largest, phase)
    return result


def _terms(name: str, m: _Models, shape: Shape) -> tuple[dict[str, int], str]:
    """The per-rank terms, and the phase whose working set they count."""
    d = m.drafter
    e, world, n, layer = shape.element_size, shape.world, d.trainable, d.layer
    split = name == "fsdp" and d.shards_state  # a drafter whole on every rank is never split
    shards = world if split else 1
    working = d.working(_shapes(shape))
    work = working.parts
    if split:
        weights = 2 * layer * e  # two layers gathered at a time
        buffers = 2 * layer * 4 + d.fsdp_head(shape, world)  # one layer's float32 gradients, reduce-scattered
    else:
        weights = n * e if e == 2 else n * 4
        buffers = layer * 4 if name in ("ddp", "fsdp") else 0
        if name == "fsdp":  # the target is split: its head's calls gather every rank's rows
            buffers += d.fsdp_head(shape, world)
    terms = {
        "target weights": (m.target_vocab if shape.cached else _target_weights(name, m, world)) * e,
        "drafter weights": weights,
        "master copy": (n * 4 // shards) if (e == 2 or shards > 1) else 0,
        "gradients": n * 4 // shards,
        "optimizer state": state_bytes(d.model, shape.optimizer) // shards,
        "activations": sum(v for k, v in work.items() if k not in ("optimizer", "LM head", "target's view")),
        "LM-head chunk": work.get("LM head", work.get("target's view", 0)),
        "communication buffers": buffers,
        "runtime": RUNTIME_BYTES[e],
    }
    return terms, working.phase


def _shapes(shape: Shape) -> Shapes:
    """The working set's shapes at `seq_length` (draftdeck.drafter.train.memory)."""
    e = shape.element_size
    return Shapes(
        batch_size=shape.batch_size, eval_batch_size=shape.eval_batch_size, longest=shape.seq_length,
        anchors_per_forward=min(shape.anchors_per_forward, shape.anchors_per_seq),
        block_size=shape.block_size, backend="flex" if e == 2 else "blocked",
        gradient_checkpointing=shape.gradient_checkpointing, element_size=e, kl=shape.kl,
    )  # fmt: skip


def _target_weights(name: str, m: _Models, world: int) -> int:
    """The target's parameters a rank holds at its peak: all of them; under fsdp the layers' shards
    and two whole layers (gathered for a forward, the next prefetched), the embedding's and head's
    vocabulary slices, the rest (norms) whole."""
    if name != "fsdp":
        return m.target_params
    layers, vocab = (-(-x // world) for x in (m.target_layers, m.target_vocab))  # 1/N each, rounded up
    return m.target_params - m.target_layers - m.target_vocab + layers + vocab + 2 * m.target_layer


def _largest_batch(name: str, m: _Models, shape: Shape, capacity: int | None) -> int:
    """The largest training micro-batch (sequences per rank) that fits; the held-out batch kept."""
    if capacity is None:
        return LARGEST_BATCH

    def fits(batch: int) -> bool:
        return sum(_terms(name, m, replace(shape, batch_size=batch))[0].values()) <= capacity

    lo, hi = 0, LARGEST_BATCH
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def describe(p: Plan) -> list[list[str]]:
    """The plan as table rows: each term, then per rank, fits, largest batch."""
    names = list(p.strategies)
    rows = [["", *names]]
    for term in TERMS:
        rows.append([term, *(binary_size(p.strategies[s].terms[term]) for s in names)])
    rows.append(["per rank", *(binary_size(p.strategies[s].per_rank) for s in names)])
    rows.append(["fits", *("yes" if p.strategies[s].fits else "no" for s in names)])
    rows.append(["largest batch", *(str(p.strategies[s].largest_batch) for s in names)])
    rows.append(["peak in", *(p.strategies[s].phase for s in names)])
    return rows


def shape_of(
    params: PlanParams | TrainParams, *, seq_length: int, element_size: int, world: int,
    heldout_rows: int | None = None,
) -> Shape:  # fmt: skip
    """The shape of a plan's or a train job's run (the two name their shape options alike);
    `heldout_rows`: the held-out rows a run evaluates, when known (0: no held-out pass)."""
    eval_batch = params.eval_batch_size if heldout_rows is None else min(params.eval_batch_size, heldout_rows)
    return Shape(
        layers=params.layers, block_size=params.block_size, seq_length=seq_length,
        batch_size=params.batch_size, eval_batch_size=eval_batch,
        anchors_per_seq=params.anchors_per_seq, anchors_per_forward=params.anchors_per_forward,
        gradient_checkpointing=params.gradient_checkpointing, kl=parse_mix(params.loss).needs_teacher,
        element_size=element_size, world=world,
        target_layer_ids=tuple(params.target_layer_ids) if params.target_layer_ids else None,
        drafter=params.drafter, ttt_steps=params.ttt_steps, mtp_steps=params.mtp_steps,
        draft_vocab_size=params.draft_vocab_size,
        eagle3_layer_ids=tuple(params.eagle3_layer_ids) if params.eagle3_layer_ids else None,
        optimizer=params.optimizer,
        cached=bool(params.hidden_states or getattr(params, "hidden_states_cache", None)),
    )  # fmt: skip


def ddp_fits(
    config: Any, params: TrainParams, longest: int, device: torch.device, world: int, heldout_rows: int,
    *, sharing: int = 1,
) -> bool | None:  # fmt: skip
    """Whether a train run holds a whole drafter per rank on `device` (`--sharding auto`), `sharing`
    ranks on this machine; None when the device's size is unknown."""
    capacity = capacity_bytes(device, sharing=sharing)
    if capacity is None:
        return None
    e = 2 if device.type == "cuda" else 4
    shape = shape_of(params, seq_length=longest, element_size=e, world=world, heldout_rows=heldout_rows)
    return plan(config, shape, capacity).strategies["ddp"].fits


def cache_disk(params: PlanParams, config: Any, shape: Shape) -> CacheDisk:
    """The disk a hidden-state cache for this run takes: the layers its drafter reads and the final
    one, over the rows of `cache_dataset` cut at seq_length (none given: one row of seq_length tokens)."""
    from draftdeck.drafter.train.cache.size import Projection, sized, stored_layers

    ids = get_kind(shape.drafter).plan(shape, config).cfg.target_layer_ids
    layers = stored_layers([int(i) for i in ids], int(config.num_hidden_layers))
    hidden, dtype, packed = int(config.hidden_size), params.cache_dtype, params.cache_compress
    if params.cache_dataset:
        return sized(params.cache_dataset, params.seq_length, layers, hidden, dtype, compression=packed)
    return Projection(1, params.seq_length, layers, hidden, dtype, compression=packed)


def to_json(p: Plan) -> str:
    return json.dumps(p.to_dict(), indent=2)
