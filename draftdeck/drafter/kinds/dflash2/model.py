"""`DFlash2Drafter`: z-lab's DFlash2 (z-lab/dflash `dflash/model.py` @ 07ebd93), as speculators 0.9.0's
`DFlash2DraftModel` holds it (its parameter names, so that its class loads an export key for key):

- every decoder layer wraps its attention and its MLP in a local convolution over the block's slots:
  token-conditioned and grouped (channels in groups of `conv_group_size` share a kernel of
  `conv_kernel_size` causal taps: a base kernel plus one predicted from the slot's own input),
  identity at initialisation, so that a fresh DFlash2 drafter is a DFlash one;
- a low-rank candidate selector reranks the head's top-k unary candidates of each slot by
  (P[previous] * R h) . S[candidate] (P, S: codebooks of rank `selector_rank` over the vocabulary), so a
  draft depends on the draft before it; trained by cross-entropy over the k candidates (the label put
  in last when the head's top-k misses it), beside the unary loss on the head's logits.

It needs the verifier's whole vocabulary (speculators refuses a draft vocabulary for it). Decoding
runs the block once and picks the drafts in order, each reranked given the one before it (the anchor
for the first). Masking inside a block is bidirectional for full-attention layers, all DraftDeck's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from draftdeck.drafter.kinds.dflash.model import DecoderLayer, DFlashDrafter
from draftdeck.drafter.model.config import DrafterConfig, DrafterConfigError
from draftdeck.drafter.model.head import HeadOut, head_loss, head_topk
from draftdeck.drafter.model.loss_terms import CE_ONLY, Mix


@dataclass(frozen=True)
class DFlash2Config(DrafterConfig):
    """DFlash's shape plus DFlash2's convolutions and selector."""

    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16
    sample_from_anchor: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size % self.conv_group_size:
            raise DrafterConfigError(
                f"conv_group_size {self.conv_group_size} does not divide hidden_size {self.hidden_size}"
            )
        if not 1 <= self.conv_kernel_size <= self.block_size:
            raise DrafterConfigError(
                f"conv_kernel_size {self.conv_kernel_size}: 1 to block_size {self.block_size}"
            )
        if not 1 <= self.selector_top_k <= self.vocab_size:
            raise DrafterConfigError(f"selector_top_k {self.selector_top_k}: 1 to the vocabulary")


def grouped_causal_conv(
    x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block: int, group: int
) -> torch.Tensor:
    """Each slot's channels mixed with the slots before it in its block: tap t reads the slot t back (none
    before the block's first), weighted by base[t] (per channel) + delta[..., t, g] (per group, the slot's
    own). `x` (..., L, H) with L a multiple of `block`; `delta` (..., L, taps, H // group)."""
    taps, hidden = base.shape
    flat = x.reshape(-1, hidden // group, group)
    d = delta.reshape(-1, taps, hidden // group)
    position = torch.arange(flat.shape[0], device=x.device).remainder(block)
    out = torch.zeros_like(flat)
    for t in range(taps):
        shifted = flat if t == 0 else torch.cat([flat.new_zeros(t, *flat.shape[1:]), flat[:-t]], dim=0)
        weight = base[t].to(flat.dtype).view(1, hidden // group, group) + d[:, t, :, None]
        out = out + shifted * weight * position.ge(t).view(-1, 1, 1)
    return out.reshape(x.shape)


class LocalConv(nn.Module):
    """The input- and output-side convolutions around one sublayer, their kernels' slot-dependent part
    from one projection of the sublayer's input (speculators' `GroupedDynamicCausalConv`)."""

    def __init__(self, hidden: int, block: int, taps: int, group: int):
        super().__init__()
        self.block, self.taps, self.group, self.groups = block, taps, group, hidden // group
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)
        with torch.no_grad():  # the identity: a fresh layer is DFlash's
            self.base_kernel[:, 0].fill_(1.0)
            self.kernel_projection.weight.zero_()

    def around(self, x: torch.Tensor, run: Any) -> torch.Tensor:
        kernels = self.kernel_projection(x).view(*x.shape[:-1], 2, self.taps, self.groups)
        inner = grouped_causal_conv(x, kernels[..., 0, :, :], self.base_kernel[0], self.block, self.group)
        return grouped_causal_conv(
            run(inner), kernels[..., 1, :, :], self.base_kernel[1], self.block, self.group
        )


class DFlash2Layer(DecoderLayer):
    def __init__(self, cfg: DFlash2Config, index: int):
        super().__init__(cfg, index)
        args = (cfg.hidden_size, cfg.block_size, cfg.conv_kernel_size, cfg.conv_group_size)
        self.attention_conv = LocalConv(*args)
        self.mlp_conv = LocalConv(*args)

    def sublayer(self, name: str, x: torch.Tensor, run: Any) -> torch.Tensor:
        return (self.attention_conv if name == "attention" else self.mlp_conv).around(x, run)


class CandidateSelector(nn.Module):
    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int, std: float = 0.02):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.randn(vocab, rank) * std)
        self.successor_codebook = nn.Parameter(torch.randn(vocab, rank) * std)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        nn.init.normal_(self.hidden_projection.weight, std=std)

    def transitions(
        self, hidden: torch.Tensor, previous: torch.Tensor, candidates: torch.Tensor
    ) -> torch.Tensor:
        """(N, k): (P[previous] * R h) . S[candidate] for each slot's candidates."""
        context = self.predecessor_codebook[previous.long()] * self.hidden_projection(hidden).to(
            self.predecessor_codebook.dtype
        )
        return (context.unsqueeze(-2) * self.successor_codebook[candidates.long()]).sum(-1)


class DFlash2Drafter(DFlashDrafter):
    fsdp_methods = ("slot_loss", "slot_choice")

    def __init__(self, config: DFlash2Config, *, initializer_range: float = 0.02):
        super().__init__(config, initializer_range=initializer_range)
        self.dflash2 = config
        for layer in self.decoder_layers:  # the base class's init drew the convolutions too: identity again
            assert isinstance(layer, DFlash2Layer)
            for conv in (layer.attention_conv, layer.mlp_conv):
                with torch.no_grad():
                    conv.base_kernel.zero_()
                    conv.base_kernel[:, 0].fill_(1.0)
                    conv.kernel_projection.weight.zero_()
        self.sample_from_anchor = config.sample_from_anchor
        self.candidate_selector = CandidateSelector(
            config.vocab_size,
            config.hidden_size,
            config.selector_rank,
            config.selector_top_k,
            initializer_range,
        )
        self.selector_weight = 1.0  # the selector's loss beside the unary one (training sets it)

    def decoder_layer(self, config: DrafterConfig, index: int) -> DecoderLayer:
        assert isinstance(config, DFlash2Config)
        return DFlash2Layer(config, index)

    def _scores(
        self, head: nn.Module, hidden: torch.Tensor, previous: torch.Tensor, candidates: torch.Tensor
    ) -> torch.Tensor:
        """(N, k) each candidate's unary logit plus its transition from the previous token."""
        weight: torch.Tensor = head.weight  # type: ignore[assignment]  # the target's head: (V, H)
        unary = torch.bmm(weight[candidates], hidden.to(weight.dtype).unsqueeze(-1)).squeeze(-1).float()
        bias: torch.Tensor | None = getattr(head, "bias", None)
        if bias is not None:
            unary = unary + bias[candidates].float()
        return unary + self.candidate_selector.transitions(hidden, previous, candidates).float()

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
        """The unary loss through the target's head (DFlash's), plus the selector's cross-entropy over
        the head's top-k candidates with the label put in last where they miss it, weighted as the token
        loss (`selector_weight`). The draft is the selector's pick among the top-k as served."""
        out = head_loss(head, hidden, labels, weights, teacher=teacher, mix=mix, chunked=chunked)
        if not hidden.shape[0]:
            return out
        with torch.no_grad():
            candidates = head_topk(head, hidden.detach(), self.candidate_selector.top_k)[1]
            hit = candidates.eq(labels[:, None])
            found = hit.any(-1)
            position = torch.where(found, hit.long().argmax(-1), candidates.shape[1] - 1)
            training = candidates.clone()
            training[~found, -1] = labels[~found]
        ce = F.cross_entropy(self._scores(head, hidden, previous, training), position, reduction="none")
        extra = self.selector_weight * ce
        out.total = out.total + (weights.float() * extra).sum()
        out.extra = extra.detach()
        with torch.no_grad():
            served = self._scores(head, hidden.detach(), previous, candidates)
            out.pred = candidates.gather(-1, served.argmax(-1, keepdim=True)).squeeze(-1)
        return out

    def slot_choice(
        self, head: nn.Module, hidden: torch.Tensor, previous: torch.Tensor, features: torch.Tensor | None
    ) -> torch.Tensor:
        candidates = head_topk(head, hidden, self.candidate_selector.top_k)[1]
        scores = self._scores(head, hidden, previous, candidates)
        return candidates.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)

    @torch.no_grad()  # drafting: no graph however it is called
    def choose_drafts(
        self, head: nn.Module, hidden: torch.Tensor, anchor: int, want: int, threshold: float = 0.0
    ) -> list[int]:
        first = 1 - self.shift
        drafts: list[int] = []
        previous = anchor
        for k in range(first, min(hidden.shape[0], first + want)):
            token = torch.tensor([previous], device=hidden.device)
            drafts.append(int(self.slot_choice(head, hidden[k : k + 1], token, None)))
            previous = drafts[-1]
        return drafts
