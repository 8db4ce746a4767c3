"""What the trainer does for a P-EAGLE drafter (draftdeck.drafter.train.drafters.TrainKind): EAGLE-3's
(its draft vocabulary, sharding, gradient sum and resume check: `Eagle3Kind`), with COD sampling drawn
per row in the micro-batch (`cod.py`, from each row's generator: a resumed run draws the same) and one
parallel forward per micro-batch over the chains it keeps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from draftdeck.drafter.kinds.eagle3.model import ttt_labels
from draftdeck.drafter.kinds.eagle3.objective import target_draft_view
from draftdeck.drafter.kinds.eagle3.train import Eagle3Kind, draft_vocab_of
from draftdeck.drafter.kinds.peagle.cod import cod_sample, kept_anchors
from draftdeck.drafter.kinds.peagle.memory import estimate_peagle
from draftdeck.drafter.kinds.peagle.model import PEagleConfig, PEagleDrafter
from draftdeck.drafter.kinds.peagle.objective import peagle_loss
from draftdeck.drafter.kinds.peagle.walked import mask_embedding, peagle_heldout_pass
from draftdeck.drafter.model.attention import Backend
from draftdeck.drafter.model.config import resolve_mask_token_id
from draftdeck.drafter.model.loss_terms import term_words
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.data import TrainData, collate
from draftdeck.drafter.train.drafters import DRAFTER_JSON, MicroBatch, config_json
from draftdeck.drafter.train.memory import MemoryEstimate, Shapes
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.truth import Batch


class PEagleKind(Eagle3Kind):
    """A P-EAGLE drafter: EAGLE-3's layer and draft vocabulary, drafting `num_depths` positions in one
    forward, trained on the chains COD sampling keeps (MicroBatch.anchors: (bsz, K, T) kept)."""

    name = "peagle"

    def __init__(self, params: TrainParams, target: Target, data: TrainData):
        self.p = params
        vocab = draft_vocab_of(params, data.trained_token_counts(int(target.config.vocab_size)))
        mask_id, self.mask_from = resolve_mask_token_id(
            int(target.config.vocab_size), tokenizer=target.tokenizer
        )
        self.cfg: PEagleConfig = PEagleConfig.of_target(
            target.config, draft_vocab_size=len(vocab.ids), aux_layer_ids=params.eagle3_layer_ids,
            mask_token_id=mask_id, num_depths=params.num_depths,
        )  # fmt: skip
        self.model: PEagleDrafter = PEagleDrafter(self.cfg)
        self.model.set_vocab(torch.from_numpy(vocab.d2t), torch.from_numpy(vocab.t2d))
        self.coverage = vocab.coverage
        self.slots = params.num_depths + 1
        self.layer_ids = self.cfg.target_layer_ids

    def fresh(self) -> nn.Module:
        return PEagleDrafter(self.cfg)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "peagle",
            **self.cfg.to_dict(),
            "down_sample_ratio": self.p.down_sample_ratio,
            "down_sample_ratio_min": self.p.down_sample_ratio_min,
            "mask_token_from": self.mask_from,
            "draft_vocab_coverage": self.coverage,
            "draft_vocab_from": self.p.draft_vocab,  # None: counted over the training split
        }

    def summary(self) -> str:
        source = self.p.draft_vocab or "the training split"
        return (
            f"drafter: P-EAGLE, {self.p.num_depths} parallel drafts a forward over"
            f" {self.cfg.draft_vocab_size:,} draft ids from {source} (covering {self.coverage:.1%} of its"
            " trained tokens), COD sampling"
            f" r = {self.p.down_sample_ratio:g} (at least {self.p.down_sample_ratio_min:g}), mask token"
            f" {self.cfg.mask_token_id} ({self.mask_from.replace('_', ' ')})"
        )

    def shard(self, strategy: Any, why: str, device: torch.device, world: int) -> str:
        if strategy == "none":
            return why
        return f"{why}; the P-EAGLE drafter (one layer) is whole on every rank, its gradients summed"

    def estimate(
        self, shapes: Shapes, target_config: object, *, held: int, capacity: int | None
    ) -> MemoryEstimate:
        ratios = (self.p.down_sample_ratio, self.p.down_sample_ratio_min)
        return estimate_peagle(
            self.cfg, target_config, self.model, shapes, ratios, held=held, capacity=capacity
        )

    def loss_formula(self) -> str:
        mix = self.p.mix
        parts = [
            f"{mix.ce:g} x CE(data's draft id)" if mix.ce else "",
            f"{mix.kl:g} x KL(target || drafter)" if mix.kl else "",
            *(f"{w:g} x {term_words(mix)[n]}" for n, w in mix.others),
        ]
        body = " + ".join(p for p in parts if p)
        return (
            f"sum over the chains COD keeps at depths d = 0..{self.p.num_depths - 1} of ({body}), over the"
            " draft vocabulary, / their count"
        )

    def micro_batch(
        self, examples: list[Any], generators: list[torch.Generator], pad_id: int, device: torch.device
    ) -> MicroBatch:
        ids, att, lm = collate(examples, pad_id, device)
        counted = ttt_labels(ids, lm, self.p.num_depths)[1]
        kept = torch.stack([
            cod_sample(row, self.p.down_sample_ratio, self.p.down_sample_ratio_min, gen)
            for row, gen in zip(counted, generators, strict=True)
        ])  # fmt: skip
        return MicroBatch(ids, att, lm, anchors=kept)

    def weight_sum(self, m: MicroBatch) -> float:
        assert m.anchors is not None
        return float((ttt_labels(m.ids, m.lm, self.p.num_depths)[1] & m.anchors).sum())

    def backward(
        self, model: nn.Module, target: Target, m: MicroBatch, normalizer: float, attention: Backend
    ) -> Counts:
        drafter: PEagleDrafter = model  # type: ignore[assignment]
        assert m.anchors is not None
        tf = target.teacher_forced(m.ids, m.att, self.layer_ids)
        view = target_draft_view(target.lm_head, tf.last_hidden, drafter.t2d.nonzero()[:, 0])
        dtype = next(drafter.parameters()).dtype
        mask_embed = mask_embedding(drafter, target, dtype)
        res = peagle_loss(
            drafter, tf.context.to(dtype), target.embed(m.ids).to(dtype), mask_embed, m.ids, m.lm, m.att,
            kept_anchors(m.anchors), depths=self.p.num_depths, teacher=view,
            mix=self.p.mix, normalizer=normalizer,
        )  # fmt: skip
        res.loss.backward()
        return res.counts

    def heldout(
        self, model: nn.Module, target: Target, batches: list[Batch], sources: Sequence[Sequence[str]],
        judge: bool, sample: bool, attention: Backend,
    ) -> tuple[Counts, dict[str, Counts]]:  # fmt: skip
        return peagle_heldout_pass(
            model, target, batches, self.p.num_depths, sources=sources, judge=judge,  # type: ignore[arg-type]
            with_loss=sample, mix=self.p.mix,
        )  # fmt: skip

    def config_files(self) -> dict[str, bytes]:
        """speculators' P-EAGLE config.json (naming no verifier: a checkpoint's), and ours with the
        training's shape."""
        from draftdeck.drafter.kinds.peagle.export import peagle_config

        return {
            "config.json": config_json(peagle_config(self.cfg)),
            DRAFTER_JSON: config_json(self.describe()),
        }
