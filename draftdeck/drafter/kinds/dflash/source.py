"""A DFlash drafter as a draft source of real speculative decoding (`spec_decode.DraftSource`)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from draftdeck.drafter.eval.spec_decode import crop_to
from draftdeck.drafter.eval.tree import DraftTree, TreeShape, ddtree
from draftdeck.drafter.model.target import Target


class DFlashSource:
    """A DFlash-family drafter (z-lab's forward signature: `position_ids`, `noise_embedding`,
    `target_hidden`, `past_key_values`, `use_cache`; attributes `target_layer_ids`, `mask_token_id`)
    proposing its drafts through the target's embedding and LM head (the argmax, or what its own heads
    choose: `choose_drafts`).

    The drafter's KV cache holds the projected context of every committed position; each call adds
    the newly observed positions, runs the block `[anchor, MASK x (B-1)]`, and crops the block back out.

    The block is always full (B = `block_size`, the drafter's own by default) even when fewer drafts
    are wanted near `max_new_tokens`: attention inside a block is bidirectional, so a shorter block
    would give other proposals than the ones the drafter was trained (and walked) with."""

    def __init__(
        self, drafter: Any, target: Target, block_size: int | None = None, *, threshold: float = 0.0
    ):
        self.drafter = drafter.eval()
        self.threshold = threshold  # a confidence head's cut (DSpark): the block stops below it
        self.layer_ids: list[int] | None = list(drafter.target_layer_ids)
        self.mask_token_id = int(drafter.mask_token_id)
        self.target = target
        # the verify block: the anchor and its drafts (a drafter that drafts from the anchor: B of them)
        self.block_size = int(block_size or drafter.slots)
        self.cache = DynamicCache()
        self.cached = 0
        self.pending: list[torch.Tensor] = []

    def begin(self, prompt_ids: list[int]) -> None:
        self.cache = DynamicCache()
        self.cached = 0
        self.pending = []

    def observe(self, features: torch.Tensor | None) -> None:
        if features is None:
            raise ValueError("a DFlash drafter needs the target's context features")
        self.pending.append(features)

    def _block(self, committed: list[int], want: int) -> torch.Tensor:
        """The drafter's final hidden states (slots, H) of the block after `committed`'s last token (at
        least `want` drafting slots), its new context folded into the drafter's cache first (the block
        itself is cropped back out)."""
        k = max(want, self.block_size - 1) - self.drafter.shift  # the block's masked slots
        anchor_pos = len(committed) - 1
        ctx = torch.cat(self.pending, dim=0)[None]
        if self.cached + ctx.shape[1] != anchor_pos:
            covered = self.cached + ctx.shape[1]
            raise RuntimeError(f"drafter context covers {covered} positions, the anchor is at {anchor_pos}")
        device = ctx.device
        block = torch.tensor([[committed[-1]] + [self.mask_token_id] * k], dtype=torch.long, device=device)
        positions = torch.arange(self.cached, anchor_pos + k + 1, device=device)[None]
        hidden = self.drafter(
            position_ids=positions,
            noise_embedding=self.target.embed(block),
            target_hidden=ctx,
            past_key_values=self.cache,
            use_cache=True,
        )
        crop_to(self.cache, anchor_pos)
        self.cached = anchor_pos
        self.pending = []
        out: torch.Tensor = hidden[0]
        return out

    @torch.inference_mode()
    def propose(self, committed: list[int], k: int) -> list[int]:
        hidden = self._block(committed, k)
        drafts: list[int] = self.drafter.choose_drafts(
            self.target.lm_head, hidden, committed[-1], k, threshold=self.threshold
        )
        return drafts

    @torch.inference_mode()
    def propose_tree(self, committed: list[int], shape: TreeShape) -> DraftTree:
        """DDTree over the block's per-position distributions (the target's LM head over each draft
        slot), the drafter's own chain (its own heads' choice, for DFlash2 and DSpark) taken first."""
        hidden = self._block(committed, self.block_size - 1)
        first = 1 - self.drafter.shift  # the block's first drafting slot
        depth = min(shape.depth, self.block_size - 1)
        chain: list[int] = self.drafter.choose_drafts(self.target.lm_head, hidden, committed[-1], depth)
        logprobs = torch.log_softmax(self.target.lm_head(hidden[first : first + depth]).float(), dim=-1)
        return ddtree(logprobs, chain, shape)
