"""What the trainer does differently per drafter kind (`TrainParams.drafter`): the model and how ranks
hold it, a micro-batch, the loss's weight sum, forward and backward, the held-out pass, the
checkpoint's config files, and what a resumed checkpoint must agree with. Everything else (data
order, ranks, optimizer, counts, truth checks, reporting) is the trainer's, the same for every kind.

Both kinds count in `Counts` slots: DFlash's block slot k drafts the k-th token after the anchor;
EAGLE-3's TTT step k is slot k + 1 (the (k + 1)-th draft of the chain), so every chart, alert and
walk reads them alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from draftdeck.drafter.model.attention import Backend
from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.dflash import DFlashDrafter
from draftdeck.drafter.model.eagle3 import Eagle3Config, Eagle3Drafter, ttt_labels
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train import sharding
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.data import TrainData, collate
from draftdeck.drafter.train.eagle3_objective import target_draft_view, ttt_loss
from draftdeck.drafter.train.eagle3_walked import eagle3_heldout_pass
from draftdeck.drafter.train.objective import (
    dflash_backward,
    label_weight_sum,
    loss_formula,
    pad_anchors,
    sample_anchors_per_row,
)
from draftdeck.drafter.train.params import DEFAULT_DRAFT_VOCAB, TrainParams
from draftdeck.drafter.train.ranks import Ranks
from draftdeck.drafter.train.sharding import Sharding
from draftdeck.drafter.train.truth import Batch
from draftdeck.drafter.train.walked import heldout_pass
from draftdeck.errors import UsageError
from draftdeck.shards.tools import DraftVocab, read_draft_vocab, vocab_of_counts

DRAFTER_JSON = "drafter.json"


@dataclass
class MicroBatch:
    """One micro-batch on this rank: (bsz, T) ids, attention and loss masks; DFlash's sampled anchors
    (bsz, A) and which are real (EAGLE-3 trains at every position: none)."""

    ids: torch.Tensor
    att: torch.Tensor
    lm: torch.Tensor
    anchors: torch.Tensor | None = None
    valid: torch.Tensor | None = None


class DrafterKind(Protocol):
    name: str
    shards_state: bool  # under fsdp, the drafter's weights, gradients and AdamW state are split
    slots: int  # `Counts` slots: 1 + the drafts a step proposes at most
    layer_ids: list[int]  # the target layers read (`Target`'s ids: hidden_states[i + 1])

    @property
    def cfg(self) -> DrafterConfig | Eagle3Config: ...
    @property
    def model(self) -> nn.Module: ...

    def describe(self) -> dict[str, Any]: ...
    def summary(self) -> str: ...  # the job log's line: what the run trains
    def shard(self, strategy: Sharding, why: str, device: torch.device, world: int) -> str: ...
    def loss_formula(self) -> str: ...
    def micro_batch(
        self, examples: list[Any], generators: list[torch.Generator], pad_id: int, device: torch.device
    ) -> MicroBatch: ...
    def align(self, micro: list[MicroBatch], ranks: Ranks) -> list[MicroBatch]: ...
    def weight_sum(self, m: MicroBatch) -> float: ...
    def backward(
        self, model: nn.Module, target: Target, m: MicroBatch, normalizer: float, attention: Backend
    ) -> Counts: ...
    def reduce_gradients(self, ranks: Ranks) -> None: ...
    def heldout(
        self, model: nn.Module, target: Target, batches: list[Batch], sources: Sequence[Sequence[str]],
        judge: bool, sample: bool, attention: Backend,
    ) -> tuple[Counts, dict[str, Counts]]: ...  # fmt: skip
    def config_files(self) -> dict[str, bytes]: ...
    def check_resume(self, state: dict[str, torch.Tensor]) -> None: ...


def drafter_kind(params: TrainParams, target: Target, data: TrainData) -> DrafterKind:
    if params.drafter == "eagle3":
        return Eagle3Kind(params, target, data)
    return DFlashKind(params, target)


def _json(d: dict[str, Any]) -> bytes:
    return json.dumps(d, indent=2).encode()


class DFlashKind:
    """A DFlash drafter: blocks at sampled anchors, every layer's context keys once per micro-batch
    (`objective.dflash_backward`)."""

    name = "dflash"
    shards_state = True

    def __init__(self, params: TrainParams, target: Target):
        self.p = params
        self.cfg = DrafterConfig.from_target(
            target.config, tokenizer=target.tokenizer, layers=params.layers, block_size=params.block_size,
            target_layer_ids=params.target_layer_ids, mask_token_id=params.mask_token_id,
        )  # fmt: skip
        self.model = DFlashDrafter(self.cfg)
        self.model.gradient_checkpointing = params.gradient_checkpointing
        self.slots = self.cfg.block_size
        self.layer_ids = list(self.cfg.target_layer_ids)

    def describe(self) -> dict[str, Any]:
        return self.cfg.to_dict()

    def summary(self) -> str:
        layers = self.cfg.layers
        return f"drafter: DFlash, {layers} layer{'s' if layers > 1 else ''}, blocks of {self.cfg.block_size}"

    def shard(self, strategy: Sharding, why: str, device: torch.device, world: int) -> str:
        """Wrap the drafter for `strategy` (`sharding.shard`); the reason stands."""
        sharding.shard(self.model, strategy, device, world)
        return why

    def loss_formula(self) -> str:
        return loss_formula(self.p.mix)

    def micro_batch(
        self, examples: list[Any], generators: list[torch.Generator], pad_id: int, device: torch.device
    ) -> MicroBatch:
        ids, att, lm = collate(examples, pad_id, device)
        anchors, valid = sample_anchors_per_row(
            lm, [len(e[0]) for e in examples], self.p.anchors_per_seq, generators
        )
        return MicroBatch(ids, att, lm, anchors, valid)

    def align(self, micro: list[MicroBatch], ranks: Ranks) -> list[MicroBatch]:
        """Every rank runs as many anchor groups (a sharded drafter's forward and backward are
        collectives): each micro-batch's anchors padded to the widest rank's."""
        widths = ranks.max([_anchors(m).shape[1] for m in micro])
        out = []
        for m, w in zip(micro, widths, strict=True):
            anchors, valid = pad_anchors(_anchors(m), _valid(m), w)
            out.append(MicroBatch(m.ids, m.att, m.lm, anchors, valid))
        return out

    def weight_sum(self, m: MicroBatch) -> float:
        return float(label_weight_sum(m.lm, _anchors(m), _valid(m), self.cfg.block_size, self.p.gamma))

    def backward(
        self, model: nn.Module, target: Target, m: MicroBatch, normalizer: float, attention: Backend
    ) -> Counts:
        mix, teacher = self.p.mix, None
        if mix[1]:  # the KL needs the target's final hidden states: the same one forward
            tf = target.teacher_forced(m.ids, m.att, self.layer_ids)
            context, teacher = tf.context, tf.last_hidden
        else:
            _, context = target.context_features(m.ids, m.att, self.layer_ids)
        return dflash_backward(
            model, target.embedding, target.lm_head, context, m.ids, m.lm, m.att,  # type: ignore[arg-type]
            _anchors(m), _valid(m), self.p.gamma, normalizer=normalizer,
            anchors_per_forward=self.p.anchors_per_forward, attention=attention, teacher=teacher, mix=mix,
        )  # fmt: skip

    def reduce_gradients(self, ranks: Ranks) -> None:
        """Nothing: FSDP2's hooks reduce a DFlash drafter's gradients (`sharding.shard`)."""

    def heldout(
        self, model: nn.Module, target: Target, batches: list[Batch], sources: Sequence[Sequence[str]],
        judge: bool, sample: bool, attention: Backend,
    ) -> tuple[Counts, dict[str, Counts]]:  # fmt: skip
        return heldout_pass(
            model, target, batches, self.p.gamma,  # type: ignore[arg-type]
            sources=sources, judge=judge, attention=attention, mix=self.p.mix,
            anchors_per_row=self.p.heldout_anchors if sample else 0, seed=self.p.seed,
        )  # fmt: skip

    def config_files(self) -> dict[str, bytes]:
        return {"config.json": _json(self.cfg.to_hf_dict()), DRAFTER_JSON: _json(self.cfg.to_dict())}

    def check_resume(self, state: dict[str, torch.Tensor]) -> None:
        """Nothing beyond the weights' keys and shapes, which loading checks."""


def _anchors(m: MicroBatch) -> torch.Tensor:
    assert m.anchors is not None, "a DFlash micro-batch has anchors"
    return m.anchors


def _valid(m: MicroBatch) -> torch.Tensor:
    assert m.valid is not None, "a DFlash micro-batch has anchors"
    return m.valid


class Eagle3Kind:
    """An EAGLE-3 drafter: training-time test over every position of every row, its draft vocabulary
    the training split's `draft_vocab_size` most frequent trained tokens or `draft_vocab`'s file
    (stored with every checkpoint: its d2t and t2d buffers, checked on resume)."""

    name = "eagle3"
    shards_state = False

    def __init__(self, params: TrainParams, target: Target, data: TrainData):
        self.p = params
        vocab = _draft_vocab(params, data.trained_token_counts(int(target.config.vocab_size)))
        self.cfg = Eagle3Config.from_target(
            target.config, draft_vocab_size=len(vocab.ids), aux_layer_ids=params.eagle3_layer_ids
        )
        self.model = Eagle3Drafter(self.cfg)
        self.model.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
        self.coverage = vocab.coverage
        self.slots = params.ttt_steps + 1
        self.layer_ids = self.cfg.target_layer_ids

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "eagle3",
            **self.cfg.to_dict(),
            "ttt_steps": self.p.ttt_steps,
            "step_decay": self.p.step_decay,
            "draft_vocab_coverage": self.coverage,
            "draft_vocab_from": self.p.draft_vocab,  # None: counted over the training split
        }

    def summary(self) -> str:
        source = self.p.draft_vocab or "the training split"
        return (
            f"drafter: EAGLE-3, {self.p.ttt_steps} TTT steps over {self.cfg.draft_vocab_size:,} draft ids"
            f" from {source}, covering {self.coverage:.1%} of the training split's trained tokens"
        )

    def shard(self, strategy: Sharding, why: str, device: torch.device, world: int) -> str:
        """The one-layer drafter stays whole on every rank (its gradients summed after each step's
        backward, `reduce_gradients`); under fsdp the trainer shards the target."""
        if strategy == "none":
            return why
        return f"{why}; the EAGLE-3 drafter (one layer) is whole on every rank, its gradients summed"

    def loss_formula(self) -> str:
        ce, kl = self.p.mix
        parts = [
            f"{ce:g} x CE(data's draft id)" if ce else "",
            f"{kl:g} x KL(target || drafter)" if kl else "",
        ]
        body = " + ".join(p for p in parts if p)
        return (
            f"sum_k {self.p.step_decay:g}^k x ({body}) over TTT steps k = 0..{self.p.ttt_steps - 1},"
            " over the draft vocabulary, / sum of weights"
        )

    def micro_batch(
        self, examples: list[Any], generators: list[torch.Generator], pad_id: int, device: torch.device
    ) -> MicroBatch:
        return MicroBatch(*collate(examples, pad_id, device))

    def align(self, micro: list[MicroBatch], ranks: Ranks) -> list[MicroBatch]:
        return micro  # every rank runs one forward per micro-batch, and as many micro-batches

    def weight_sum(self, m: MicroBatch) -> float:
        counted = ttt_labels(m.ids, m.lm, self.p.ttt_steps)[1]
        per_step = counted.sum(dim=(0, 2)).double()
        weights = self.p.step_decay ** torch.arange(
            self.p.ttt_steps, dtype=torch.float64, device=per_step.device
        )
        return float((weights * per_step).sum())

    def backward(
        self, model: nn.Module, target: Target, m: MicroBatch, normalizer: float, attention: Backend
    ) -> Counts:
        drafter: Eagle3Drafter = model  # type: ignore[assignment]
        tf = target.teacher_forced(m.ids, m.att, self.layer_ids)
        # the target's view: the KL's soft labels, and the expected acceptance counts
        view = target_draft_view(target.lm_head, tf.last_hidden, drafter.t2d.nonzero()[:, 0])
        dtype = next(drafter.parameters()).dtype
        res = ttt_loss(
            drafter, tf.context.to(dtype), target.embed(m.ids).to(dtype), m.ids, m.lm, m.att,
            self.p.ttt_steps, teacher=view, mix=self.p.mix, decay=self.p.step_decay, normalizer=normalizer,
        )  # fmt: skip
        res.loss.backward()
        return res.counts

    def reduce_gradients(self, ranks: Ranks) -> None:
        """Sum the gradients over the ranks (each rank's loss is divided by the global weight sum)."""
        if ranks.world == 1:
            return
        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            ranks.sum(p.grad)

    def heldout(
        self, model: nn.Module, target: Target, batches: list[Batch], sources: Sequence[Sequence[str]],
        judge: bool, sample: bool, attention: Backend,
    ) -> tuple[Counts, dict[str, Counts]]:  # fmt: skip
        return eagle3_heldout_pass(
            model, target, batches, self.p.ttt_steps, sources=sources, judge=judge,  # type: ignore[arg-type]
            with_loss=sample, decay=self.p.step_decay, mix=self.p.mix,
        )  # fmt: skip

    def config_files(self) -> dict[str, bytes]:
        """The flat format's config.json (the checkpoint's weights are that format's: an export reads
        it as SGLang would), and ours with the training's shape."""
        from draftdeck.drafter.model.eagle3_formats import eagle3_config

        return {"config.json": _json(eagle3_config(self.cfg, "sglang")), DRAFTER_JSON: _json(self.describe())}

    def check_resume(self, state: dict[str, torch.Tensor]) -> None:
        """A checkpoint's draft vocabulary must be the one built now: its LM head's rows are those ids
        (a regenerated mapping silently misaligns them, SpecForge #534)."""
        for name in ("d2t", "t2d"):
            saved, built = state.get(name), getattr(self.model, name).cpu()
            if saved is None or saved.shape != built.shape or not torch.equal(saved.cpu(), built):
                differ = "absent" if saved is None else "different"
                raise UsageError(
                    f"the checkpoint's draft vocabulary ({name}: {differ}) is not the one the inputs give"
                    " now: its LM head's rows are the checkpoint's ids; resume with the data it started"
                    " on, pin its mapping (draft_vocab: the checkpoint's model.safetensors), or train"
                    " into a new run folder"
                )


def _draft_vocab(params: TrainParams, counts: np.ndarray) -> DraftVocab:
    """The run's draft vocabulary: `draft_vocab`'s file, else the training split's `draft_vocab_size`
    most frequent trained tokens (`counts`, which give the coverage either way)."""
    if params.draft_vocab is None:
        return vocab_of_counts(counts, params.draft_vocab_size or DEFAULT_DRAFT_VOCAB)
    vocab = read_draft_vocab(Path(params.draft_vocab), counts)
    if params.draft_vocab_size is not None and params.draft_vocab_size != len(vocab.ids):
        raise UsageError(
            f"draft_vocab_size {params.draft_vocab_size:,} but {params.draft_vocab} holds {len(vocab.ids):,}"
            " draft ids: give one of them"
        )
    return vocab
