"""`TrainParams`: the parameters of a drafter training run, defined once (CLI, API, job kinds)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from draftdeck.drafter.kinds import NAMES, DrafterName, Options, get_kind
from draftdeck.drafter.model.loss_terms import DEFAULT_LK_ETA, Mix, parse_mix
from draftdeck.jobs.params import JobParams, inputs_field
from draftdeck.units import parse_size

# Defaults chosen from measurements (docs/train.md, "Drafter truth").
OFF_TARGET_RATIO = 1.25
# On the target's own greedy answers the data-judged walk runs 0-3 % above the walk over its answers
# (tokenize re-tokenizes the answers' text; the target's own token stream splits some words
# otherwise), once above 5 %; on another model's answers +15 % at step 100, +25-40 % after.
OFF_TARGET_TOLERANCE = 0.10


class TrainRun(JobParams):
    """What every `train` run needs, whatever its drafter kind."""

    inputs: list[str] = inputs_field("Dataset folders (DraftDeck shards) to train on")
    target: str = Field(description="Local HF folder of the target model (a causal LM) and its tokenizer")
    out: str | None = Field(
        title="Run folder",
        default=None,
        description="Run folder: checkpoints/, run.json; a run resumes when it holds checkpoints"
        " (default: the job's folder)",
    )
    drafter: DrafterName = Field(
        "dflash",
        title="Drafter kind",
        description="; ".join(f"{name} = {get_kind(name).summary}" for name in NAMES),
    )
    # ce+kl: measured best on the target's own sampled answers without losing on its greedy ones
    # (benchmarks/truth.py --losses, README); kl alone loses greedy tau on the target's greedy answers
    loss: str = Field(
        "ce+kl",
        description="What each drafted slot learns, a term or a weighted sum (ce+kl, 0.5*ce+tv): ce ="
        " the data's next token (cross-entropy); kl = the target's distribution there (forward KL,"
        " exact, one more head matmul per slot); rkl = reverse KL; jsd = Jensen-Shannon; tv = 1 - sum"
        " min(p, q) (one minus the acceptance rate); nla = -log sum min(p, q) (the LK loss); lk_hybrid"
        " = lambda KL + (1 - lambda) TV, lambda = exp(-lk_eta sum min(p, q)). A bare ce or kl weighs"
        " ce_weight or kl_weight",
    )
    ce_weight: float = Field(1.0, gt=0, le=100, description="Weight of a bare ce term (ce, ce+kl)")
    kl_weight: float = Field(1.0, gt=0, le=100, description="Weight of a bare kl term (kl, ce+kl)")
    lk_eta: float = Field(
        DEFAULT_LK_ETA, gt=0, le=100, description="eta of lk_hybrid: lambda = exp(-eta sum min(p, q))"
    )
    attention: Literal["auto", "flex", "blocked", "dense"] = Field(
        "auto",
        description="Training attention over the blocks: auto = flex (compiled) on a GPU, blocked"
        " (sparse by block, in PyTorch ops) elsewhere; dense = SDPA under the full mask (the"
        " reference)",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute each drafter layer in the backward: less memory, ~1/3 more time"
    )
    memory_check: bool = Field(
        True, description="Before step 1, refuse a run whose estimated peak memory exceeds the device's"
    )
    seq_length: int | None = Field(
        None, ge=2, le=1_000_000, description="Truncate rows to this many tokens (default: whole rows)"
    )
    batch_size: int = Field(4, ge=1, le=4096, description="Sequences per micro-batch per device")
    grad_accum: int = Field(1, ge=1, le=1024, description="Micro-batches per optimizer step")
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw",
        description="adamw = AdamW over every parameter; muon = PyTorch's Muon over the 2-D weight"
        " matrices of the drafter's hidden layers (its step scaled to AdamW's size, so the same lr),"
        " AdamW over the embedding, LM head, input projection, norms and biases",
    )
    lr: float = Field(
        6e-4, gt=0, le=1.0, title="Learning rate", description="Peak learning rate (AdamW's, and Muon's)"
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Final learning rate of the cosine, as a ratio of lr"
    )
    weight_decay: float = Field(0.0, ge=0, le=1, description="Weight decay (AdamW's, and Muon's)")
    warmup_ratio: float = Field(0.04, ge=0, le=1, description="Fraction of steps with linear warmup")
    max_steps: int | None = Field(
        None, ge=1, le=100_000_000, description="Optimizer steps (overrides epochs)"
    )
    epochs: float = Field(
        1.0, gt=0, le=1000, description="Passes over the training split (when no max_steps)"
    )
    clip: float = Field(1.0, gt=0, le=1e6, description="Gradient-norm clipping threshold")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for init, order, anchors")
    devices: int = Field(
        1,
        ge=1,
        le=4096,
        description="World size: ranks, one per device (under torchrun or srun: the launcher's)",
    )
    sharding: Literal["auto", "none", "ddp", "fsdp"] = Field(
        "auto",
        description="How ranks hold the drafter: none = one process; ddp = whole on every rank,"
        " gradients all-reduced per layer; fsdp = weights, gradients and AdamW state split across"
        " ranks (FSDP2), and the target's decoder layers; auto = none on one rank, else ddp when it"
        " fits the device, fsdp when not. An EAGLE-3 drafter (one layer) stays whole on every rank:"
        " fsdp shards its target",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when present, else cpu")
    checkpoint_every: int = Field(500, ge=1, le=10_000_000, description="Steps between checkpoints")
    keep_checkpoints: int = Field(
        3, ge=1, le=1000, description="Latest checkpoints kept (the best is kept too)"
    )
    eval_every: int = Field(500, ge=1, le=10_000_000, description="Steps between held-out evaluations")
    log_every: int = Field(10, ge=1, le=1_000_000, description="Steps between training metric points")
    heldout_fraction: float = Field(0.02, ge=0, lt=1, description="Fraction of conversations held out")
    heldout_max_rows: int = Field(256, ge=1, le=1_000_000, description="Held-out rows used per evaluation")
    eval_batch_size: int = Field(8, ge=1, le=4096, description="Sequences per held-out batch")
    truth_rows: int = Field(
        64,
        ge=0,
        le=100_000,
        description="Before step 1: training rows checked against the target (target agreement), and"
        " held-out prompts the target answers, for the tau judged by the target (0: neither)",
    )
    truth_max_new_tokens: int = Field(
        512, ge=1, le=32_768, description="Tokens per answer at most, for the tau judged by the target"
    )
    off_target_ratio: float = Field(
        OFF_TARGET_RATIO,
        gt=0,
        le=1000,
        description="Alert data_not_target_output when the data differs from the target's greedy token"
        " more than this many times as often as the target's own temperature-1 samples would",
    )
    off_target_tolerance: float = Field(
        OFF_TARGET_TOLERANCE,
        gt=0,
        le=10,
        description="Alert data_not_target_output when the held-out tau judged by the data is above the"
        " tau on the target's own answers by more than this share",
    )
    off_target: Literal["alert", "fail"] = Field(
        "alert",
        description="What data_not_target_output does: alert (the run goes on) or fail (the run"
        " stops before step 1)",
    )
    hidden_states: str | None = Field(
        None,
        description="A hidden-state cache (draftdeck cache-hidden) of these datasets and this target:"
        " the run reads the target's hidden states from it, the target's decoder layers not loaded"
        " (only its embedding and LM head); truth_rows is 0 unless given (the target's own answers need"
        " its layers: a value above 0 is refused) and sharding none or ddp",
    )
    hidden_states_cache: str | None = Field(
        None,
        description="A hidden-state cache folder this run makes its own: when it is not there, the first"
        " epoch trains online and fills it, the later epochs read it (a run of several ranks: built first"
        " with the cache-hidden job's code); every later start reads it as hidden_states (a resume, another"
        " kind on the same data: no target forward); as hidden_states, truth_rows 0 unless given",
    )

    @field_validator("loss")
    @classmethod
    def _loss_terms(cls, value: str) -> str:
        return check_loss(value)


class TrainParams(Options, TrainRun):
    """What a `train` run needs: the fields every run has, then every drafter kind's options
    (draftdeck.drafter.kinds.Options, each kind's options.py); every field bounded and described for
    forms and the API. A kind's options given to a run of another kind are refused, not ignored."""

    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "target", "hidden_states", *Options.kind_paths())
    output_paths: ClassVar[tuple[str, ...]] = ("out", "hidden_states_cache")
    essentials: ClassVar[tuple[str, ...]] = (
        "drafter",
        "block_size",
        "layers",
        "seq_length",
        "batch_size",
        "lr",
        "max_steps",
        "epochs",
        "devices",
        "sharding",
    )
    resumes_in_out: ClassVar[bool] = True

    @property
    def mix(self) -> Mix:
        """Each slot's loss, its terms and weights, as the objective takes it."""
        return parse_mix(self.loss, ce_weight=self.ce_weight, kl_weight=self.kl_weight, lk_eta=self.lk_eta)

    @model_validator(mode="after")
    def _check(self) -> TrainParams:
        if self.target_layer_ids is not None and (
            not self.target_layer_ids or min(self.target_layer_ids) < 0
        ):
            raise ValueError("target_layer_ids must be a non-empty list of layer indexes >= 0")
        cached = [n for n in ("hidden_states", "hidden_states_cache") if getattr(self, n) is not None]
        if len(cached) == 2:
            raise ValueError("hidden_states, hidden_states_cache: give one (a cache to read, or to make)")
        if cached:
            if "truth_rows" not in self.model_fields_set:  # the default is not the user's: off, said at start
                self.truth_rows = 0
            if self.truth_rows or self.sharding == "fsdp":
                raise ValueError(
                    f"{cached[0]}: a run from the cache has no decoder layers to generate the target's"
                    f" own answers (truth_rows {self.truth_rows}: set 0) or to shard (sharding"
                    f" {self.sharding})"
                )
        kind = get_kind(self.drafter)
        if self.sharding == "fsdp" and kind.fsdp_refused:  # refused at submission, not on every rank
            raise ValueError(f"sharding fsdp: a {kind.title} drafter cannot shard: {kind.fsdp_refused}")
        read = kind.options
        for group in Options.groups():
            if group in read:
                continue
            given = [n for n, f in group.model_fields.items() if getattr(self, n) != f.get_default()]
            if given:  # not silently ignored
                # "an EAGLE-3", "an MTP" (an initialism read letter by letter: "em-tee-pee"), "a DSpark"
                spelled = group.title[:2].isupper() and group.title[:1] in "FHLMNRSX"
                article = "an" if group.title[:1] in "AEIOU" or spelled else "a"
                what = f"{article} {group.title} option" if len(given) == 1 else f"{group.title} options"
                kinds = " or ".join(n for n in NAMES if group in get_kind(n).options)
                raise ValueError(f"{', '.join(given)}: {what} (give drafter {kinds})")
        return self


def check_loss(value: str) -> str:
    """`value` if it names a mix of loss terms (`losses.parse_mix`), else the ValueError naming them."""
    parse_mix(value)
    return value


def _train_field(name: str) -> Any:
    """TrainParams' definition of `name`: the planner takes the train job's shape options as they are."""
    return TrainParams.model_fields[name]


class PlanParams(JobParams):
    """What `draftdeck plan` reads: a target's config and a train job's shape, on N devices of a size."""

    target: str = Field(description="The target's HF folder or its config.json (no weights are read)")
    devices: int = Field(8, ge=1, le=4096, description="Devices (ranks) per node")
    nodes: int = Field(1, ge=1, le=4096, description="Nodes")
    device_memory: str = Field("80GiB", description="Memory of one device, e.g. 80GiB, 141GiB, 24GB")
    dtype: Literal["bf16", "float32"] = Field(
        "bf16", description="Compute dtype: bf16 as a GPU run trains, float32 as a CPU run"
    )
    drafter: DrafterName = _train_field("drafter")
    layers: int = _train_field("layers")
    block_size: int = _train_field("block_size")
    ttt_steps: int = _train_field("ttt_steps")
    mtp_steps: int = _train_field("mtp_steps")
    draft_vocab_size: int | None = _train_field("draft_vocab_size")
    eagle3_layer_ids: list[int] | None = _train_field("eagle3_layer_ids")
    seq_length: int = Field(4096, ge=2, le=1_000_000, description="Tokens of the longest row trained")
    batch_size: int = Field(1, ge=1, le=4096, description="Sequences per micro-batch per device")
    eval_batch_size: int = _train_field("eval_batch_size")
    anchors_per_seq: int = _train_field("anchors_per_seq")
    anchors_per_forward: int = _train_field("anchors_per_forward")
    gradient_checkpointing: bool = _train_field("gradient_checkpointing")
    loss: str = _train_field("loss")
    target_layer_ids: list[int] | None = _train_field("target_layer_ids")
    optimizer: Literal["adamw", "muon"] = _train_field("optimizer")
    hidden_states: bool = Field(
        False,
        description="Plan a run from a hidden-state cache (train --hidden-states): the target's embedding"
        " and LM head in memory, not its decoder layers (no fsdp); and the cache's disk",
    )
    cache_dataset: list[str] | None = Field(
        None,
        description="With hidden_states: dataset folders whose cache the plan sizes on disk (rows cut at"
        " seq_length; none given: one row of seq_length tokens)",
    )
    cache_dtype: Literal["bf16", "fp16", "fp32"] = Field(
        "bf16", description="With hidden_states: the cache's stored precision (cache-hidden --dtype)"
    )
    cache_compress: str | None = Field(
        None, description="With hidden_states: the cache's compression (cache-hidden --compress zstd[:LEVEL])"
    )

    input_paths: ClassVar[tuple[str, ...]] = ("target", "cache_dataset")

    @field_validator("loss")
    @classmethod
    def _loss_terms(cls, value: str) -> str:
        return check_loss(value)

    @field_validator("device_memory")
    @classmethod
    def _size(cls, value: str) -> str:
        parse_size(value)  # raises ValueError naming the forms it reads
        return value

    @model_validator(mode="after")
    def _cached(self) -> PlanParams:
        from draftdeck.hidden.compression import parse_compression

        given = [n for n in ("cache_dataset", "cache_dtype", "cache_compress") if n in self.model_fields_set]
        if self.cache_compress is not None:  # "zstd:3"; ValueError names the forms it reads
            self.cache_compress = parse_compression(self.cache_compress)
        if given and not self.hidden_states:
            raise ValueError(
                f"{', '.join(given)}: the cache's options plan a run from one (give hidden_states)"
            )
        return self
