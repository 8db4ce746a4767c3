"""Baselines a drafter's tau must be read against, verified by the target exactly as a drafter is:

- prompt-lookup decoding: copy what followed the latest earlier occurrence of the context's last
  n-gram (n from `max_ngram` down to `min_ngram`); on a tiny target's repetitive text this alone
  reaches tau 3-4, so a demo drafter has to beat it to mean anything;
- the untrained drafter: the same architecture freshly initialised (tau ~ 1 incl. bonus): each kind
  makes its own (`DrafterKind.untrained`).
"""

from __future__ import annotations

import torch


class PromptLookup:
    """A `DraftSource` that needs no model."""

    layer_ids: list[int] | None = None

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def begin(self, prompt_ids: list[int]) -> None:
        pass

    def observe(self, features: torch.Tensor | None) -> None:
        pass

    def propose(self, committed: list[int], k: int) -> list[int]:
        n_ctx = len(committed)
        for n in range(min(self.max_ngram, n_ctx - 1), self.min_ngram - 1, -1):
            tail = committed[n_ctx - n :]
            # latest earlier match first: the most recent context is the likeliest to repeat
            for start in range(n_ctx - n - 1, -1, -1):
                if committed[start : start + n] == tail:
                    follow = committed[start + n : start + n + k]
                    if follow:
                        return follow
        return []
