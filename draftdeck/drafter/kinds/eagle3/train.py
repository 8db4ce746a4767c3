"""What the trainer does for an EAGLE-3 drafter (draftdeck.drafter.train.drafters.TrainKind)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from draftdeck.drafter.kinds.eagle3.memory import estimate_eagle3
from draftdeck.drafter.kinds.eagle3.model import Eagle3Config, Eagle3Drafter, ttt_labels
from draftdeck.drafter.kinds.eagle3.objective import target_draft_view, ttt_loss
from draftdeck.drafter.kinds.eagle3.options import DEFAULT_DRAFT_VOCAB
from draftdeck.drafter.kinds.eagle3.walked import eagle3_heldout_pass
from draftdeck.drafter.model.attention import Backend
from draftdeck.drafter.model.loss_terms import term_words
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.data import TrainData, collate
from draftdeck.drafter.train.drafters import DRAFTER_JSON, MicroBatch, config_json
from draftdeck.drafter.train.memory import MemoryEstimate, Shapes
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.ranks import Ranks
from draftdeck.drafter.train.sharding import Sharding
from draftdeck.drafter.train.truth import Batch
from draftdeck.errors import UsageError
from draftdeck.shards.tools import DraftVocab, read_draft_vocab, vocab_of_counts


class UnrolledChain:
    """The steps a chain drafter's training shares (EAGLE-3, and the MTP layer trained as it is): one
    layer unrolled `steps` times over every position of every row (training-time test), step k weighed
    `decay`^k, its drafter whole on every rank."""

    shards_state = False
    p: TrainParams
    model: nn.Module
    layer_ids: list[int]
    steps: int  # the unrolled steps (EAGLE-3's ttt_steps, MTP's mtp_steps)
    decay: float  # each step's weight is decay ** k (EAGLE-3's step_decay, MTP's mtp_step_beta)

    def micro_batch(
        self, examples: list[Any], generators: list[torch.Generator], pad_id: int, device: torch.device
    ) -> MicroBatch:
        return MicroBatch(*collate(examples, pad_id, device))

    def align(self, micro: list[MicroBatch], ranks: Ranks) -> list[MicroBatch]:
        return micro  # every rank runs one forward per micro-batch, and as many micro-batches

    def weight_sum(self, m: MicroBatch) -> float:
        counted = ttt_labels(m.ids, m.lm, self.steps)[1]
        per_step = counted.sum(dim=(0, 2)).double()
        weights = self.decay ** torch.arange(self.steps, dtype=torch.float64, device=per_step.device)
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
            self.steps, teacher=view, mix=self.p.mix, decay=self.decay, normalizer=normalizer,
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
            model, target, batches, self.steps, sources=sources, judge=judge,  # type: ignore[arg-type]
            with_loss=sample, decay=self.decay, mix=self.p.mix,
        )  # fmt: skip


class Eagle3Kind(UnrolledChain):
    """An EAGLE-3 drafter: training-time test over every position of every row, its draft vocabulary
    the training split's `draft_vocab_size` most frequent trained tokens or `draft_vocab`'s file
    (stored with every checkpoint: its d2t and t2d buffers, checked on resume)."""

    name = "eagle3"

    def __init__(self, params: TrainParams, target: Target, data: TrainData):
        self.p = params
        vocab = draft_vocab_of(params, data.trained_token_counts(int(target.config.vocab_size)))
        self.cfg = Eagle3Config.from_target(
            target.config, draft_vocab_size=len(vocab.ids), aux_layer_ids=params.eagle3_layer_ids
        )
        self.model = Eagle3Drafter(self.cfg)
        self.model.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
        self.coverage = vocab.coverage
        self.slots = params.ttt_steps + 1
        self.layer_ids = self.cfg.target_layer_ids
        self.steps, self.decay = params.ttt_steps, params.step_decay

    def fresh(self) -> nn.Module:
        return Eagle3Drafter(self.cfg)

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

    def estimate(
        self, shapes: Shapes, target_config: object, *, held: int, capacity: int | None
    ) -> MemoryEstimate:
        return estimate_eagle3(
            self.cfg, target_config, self.model, shapes, self.p.ttt_steps, held=held, capacity=capacity
        )

    def loss_formula(self) -> str:
        mix = self.p.mix
        ce, kl = mix.ce, mix.kl
        parts = [
            f"{ce:g} x CE(data's draft id)" if ce else "",
            f"{kl:g} x KL(target || drafter)" if kl else "",
            *(f"{w:g} x {term_words(mix)[n]}" for n, w in mix.others),
        ]
        body = " + ".join(p for p in parts if p)
        return (
            f"sum_k {self.p.step_decay:g}^k x ({body}) over TTT steps k = 0..{self.p.ttt_steps - 1},"
            " over the draft vocabulary, / sum of weights"
        )

    def config_files(self) -> dict[str, bytes]:
        """The flat format's config.json (the checkpoint's weights are that format's: an export reads
        it as SGLang would), and ours with the training's shape."""
        from draftdeck.drafter.kinds.eagle3.formats import eagle3_config

        return {
            "config.json": config_json(eagle3_config(self.cfg, "sglang")),
            DRAFTER_JSON: config_json(self.describe()),
        }

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


def draft_vocab_of(params: TrainParams, counts: np.ndarray) -> DraftVocab:
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
