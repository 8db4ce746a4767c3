"""`DSparkDrafter`: DFlash's block drafter plus two heads (DeepSpec, arXiv 2607.05147; speculators 0.9.0's
`DSparkDraftModel`, whose parameter names these are, so that its class loads an export key for key):

- a Markov head biasing each slot's logits by the slot's previous token: e = W1[previous] (rank r);
  vanilla adds W2 e, gated W2 (sigmoid(G [h ; e]) * e), rnn W2 tanh(o_k) with a recurrent state over
  the block's slots (z = [state ; e_k ; h_k] -> gate, candidate, output);
- a confidence head: each slot's probability of being accepted, sigmoid(P [h ; e]) (or of h alone),
  trained by binary cross-entropy against the slot's analytical acceptance sum_v min(p, q) (the
  target's and the drafter's distributions: what speculative sampling accepts at temperature 1).

It drafts from the anchor by default (`sample_from_anchor`, DeepSpec's and speculators' default): slot j
of the block [anchor, MASK x (B-1)] predicts the token j + 1 after the anchor, so a block drafts B tokens
(DFlash's drafts B - 1). Decoding picks the drafts one after another, each biased by the one before it
(the anchor for the first); the confidence head may stop a block early (`choose_drafts` with a
threshold: confidence-scheduled verification, vLLM PR #47808).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.model.config import DrafterConfig, DrafterConfigError
from draftdeck.drafter.model.head import HeadOut, head_loss
from draftdeck.drafter.model.loss_terms import CE_ONLY, Mix

MARKOV_HEADS = ("vanilla", "gated", "rnn")


@dataclass(frozen=True)
class DSparkConfig(DrafterConfig):
    """DFlash's shape plus DSpark's heads."""

    markov_rank: int = 256  # 0: no Markov head
    markov_head_type: str = "vanilla"
    confidence_head: bool = True
    confidence_with_markov: bool = True  # the confidence head reads [h ; e], else h alone
    sample_from_anchor: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.markov_head_type not in MARKOV_HEADS:
            raise DrafterConfigError(f"markov_head_type {self.markov_head_type!r}: one of {MARKOV_HEADS}")
        if self.markov_rank < 0:
            raise DrafterConfigError(f"markov_rank {self.markov_rank}: 0 (no Markov head) or more")
        if self.confidence_head and self.confidence_with_markov and not self.markov_rank:
            raise DrafterConfigError(
                "a confidence head that reads the Markov embedding needs markov_rank > 0"
            )


class MarkovHead(nn.Module):
    """The low-rank logit bias B = W2 u(W1[previous], h) (see the module doc)."""

    def __init__(self, vocab: int, rank: int, hidden: int, kind: str):
        super().__init__()
        self.kind, self.rank = kind, rank
        self.markov_w1 = nn.Embedding(vocab, rank)
        nn.init.normal_(self.markov_w1.weight, std=0.01)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def inputs(self, hidden: torch.Tensor, previous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(u, e) over whole blocks: `hidden` (..., slots, H), `previous` (..., slots) -> each (..., slots,
        r): what W2 maps to the bias, and the previous token's embedding."""
        e = self.markov_w1(previous.long())
        h = hidden.to(e.dtype)
        if self.kind == "vanilla":
            return e, e
        if self.kind == "gated":
            return torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1))) * e, e
        state = e.new_zeros(*e.shape[:-2], self.rank)
        out = []
        for k in range(e.shape[-2]):
            gate, cand, o = self.joint_proj(torch.cat([state, e[..., k, :], h[..., k, :]], dim=-1)).chunk(
                3, -1
            )
            g = torch.sigmoid(gate)
            state = g * state + (1.0 - g) * torch.tanh(cand)
            out.append(torch.tanh(o))
        return torch.stack(out, dim=-2), e


class ConfidenceHead(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class DSparkDrafter(DFlashDrafter):
    fsdp_methods = ("block_features", "slot_loss", "slot_choice")

    def __init__(self, config: DSparkConfig, *, initializer_range: float = 0.02):
        super().__init__(config, initializer_range=initializer_range)
        self.dspark = config
        self.sample_from_anchor = config.sample_from_anchor
        h, r = config.hidden_size, config.markov_rank
        self.markov_head = MarkovHead(config.vocab_size, r, h, config.markov_head_type) if r else None
        self.confidence_head = (
            ConfidenceHead(h + (r if config.confidence_with_markov else 0))
            if config.confidence_head
            else None
        )
        self.confidence_weight = 1.0  # the BCE's weight beside the token loss (training sets it)

    # -- the family's hooks (draftdeck.drafter.kinds.dflash.model) --------------------------------------
    def block_features(self, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor | None:
        """[u ; e] per slot (..., slots, 2r): the Markov bias's input and the previous token's
        embedding; the hidden state and the embedding feed the confidence head."""
        if self.markov_head is None:
            return None
        s = self.shift  # a block that drafts from the anchor: its slots begin at the verify block's slot 1
        u, e = self.markov_head.inputs(hidden[..., s:, :], previous[..., s:])
        features = torch.cat([u, e], dim=-1)
        return F.pad(features, (0, 0, s, 0)) if s else features

    def _bias(self, features: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.markov_head is None or features is None:
            return None
        return features[..., : self.markov_head.rank], self.markov_head.markov_w2.weight

    def confidence_logits(self, hidden: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
        assert self.confidence_head is not None
        if self.dspark.confidence_with_markov:
            assert features is not None and self.markov_head is not None
            e = features[..., self.markov_head.rank :]
            return self.confidence_head(torch.cat([hidden, e.to(hidden.dtype)], dim=-1))
        return self.confidence_head(hidden)

    def slot_loss(
        self,
        head: nn.Module,
        hidden: torch.Tensor,
        previous: torch.Tensor,
        features: torch.Tensor | None,
        labels: torch.Tensor,
        weights: torch.Tensor,
        *,
        teacher: torch.Tensor | None = None,
        mix: Mix | tuple[float, float] = CE_ONLY,
        chunked: bool = True,
    ) -> HeadOut:
        """The target head's logits plus the Markov bias, then the confidence head's BCE against each
        slot's acceptance sum min(p, q) (which needs the target's distribution, `teacher`), weighted
        as the token loss and added to it (`confidence_weight`)."""
        out = head_loss(
            head,
            hidden,
            labels,
            weights,
            teacher=teacher,
            mix=mix,
            chunked=chunked,
            low_rank=self._bias(features),
        )
        if self.confidence_head is None or teacher is None or out.accept is None:
            return out
        logit = self.confidence_logits(hidden, features).float()
        bce = F.binary_cross_entropy_with_logits(logit, out.accept.to(logit.dtype), reduction="none")
        extra = self.confidence_weight * bce
        out.total = out.total + (weights.float() * extra).sum()
        out.extra = extra.detach()
        return out

    def slot_choice(
        self, head: nn.Module, hidden: torch.Tensor, previous: torch.Tensor, features: torch.Tensor | None
    ) -> torch.Tensor:
        bias = self._bias(features)
        logits = head(hidden).float()
        if bias is not None:
            logits = logits + F.linear(bias[0].to(bias[1].dtype), bias[1]).float()
        return logits.argmax(-1)

    @torch.no_grad()  # drafting: no graph however it is called
    def choose_drafts(
        self, head: nn.Module, hidden: torch.Tensor, anchor: int, want: int, threshold: float = 0.0
    ) -> list[int]:
        """Drafts one after another, each biased by the one before it (the anchor for the first); with
        a `threshold`, the block stops before the first draft whose cumulative confidence (the
        product of the confidence head's probabilities so far) falls below it."""
        first = 1 - self.shift  # the block's first drafting slot (DFlash's convention: slot 1)
        drafts: list[int] = []
        previous, state, alive = anchor, None, 1.0
        for k in range(min(hidden.shape[0], first + want)):
            h = hidden[k : k + 1]
            token = torch.tensor([previous], device=h.device)
            features, state = self._step_features(h, token, state)  # the anchor's slot, too: its state
            if k < first:
                continue
            if threshold > 0 and self.confidence_head is not None:
                alive *= float(torch.sigmoid(self.confidence_logits(h, features)))
                if alive < threshold:
                    break
            drafts.append(int(self.slot_choice(head, h, token, features)))
            previous = drafts[-1]
        return drafts

    def _step_features(
        self, h: torch.Tensor, previous: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor | None, Any]:
        """One slot's [u ; e], carrying the recurrent head's state from the slot before."""
        m = self.markov_head
        if m is None:
            return None, None
        e = m.markov_w1(previous.long())
        hh = h.to(e.dtype)
        if m.kind == "vanilla":
            return torch.cat([e, e], dim=-1), None
        if m.kind == "gated":
            return torch.cat([torch.sigmoid(m.gate_proj(torch.cat([hh, e], -1))) * e, e], dim=-1), None
        state = e.new_zeros(e.shape[0], m.rank) if state is None else state
        gate, cand, o = m.joint_proj(torch.cat([state, e, hh], dim=-1)).chunk(3, -1)
        g = torch.sigmoid(gate)
        state = g * state + (1.0 - g) * torch.tanh(cand)
        return torch.cat([torch.tanh(o), e], dim=-1), state
