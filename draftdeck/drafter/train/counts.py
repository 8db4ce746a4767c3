"""Acceptance metrics as counts, so that steps, ranks and runs aggregate exactly.

Ratios are computed only to be shown (`tau_*`, `accuracy`). One `Counts` packs into a single int64
vector and a float64 vector (`to_tensors` / `from_tensors`), which is what the ranks all_reduce (SUM).
Metric names are those of `draftdeck.jobs.context`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftdeck.drafter.train.truth import Agreement


@dataclass
class Counts:
    """Counts over some blocks. Index conventions: `correct[k]`/`total[k]` for block slot
    k = 1..B-1 (index 0 unused); `*_hist[n]` for accepted length n = 1..B incl. bonus (index 0
    unused)."""

    block_size: int
    correct: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)
    anchor_accepted: int = 0  # sum over blocks of the leading correct run
    anchor_blocks: int = 0
    anchor_hist: list[int] = field(default_factory=list)
    walked_accepted: int = 0  # sum over verify steps of accepted draft tokens
    walked_steps: int = 0
    walked_hist: list[int] = field(default_factory=list)
    # the walk over the target's own greedy answers (the target-judged walk), and target agreement
    # on the data (draftdeck.drafter.train.truth)
    target_walked_accepted: int = 0
    target_walked_steps: int = 0
    target_walked_hist: list[int] = field(default_factory=list)
    agree_tokens: int = 0  # trained tokens the target's view covers
    agree_matches: int = 0  # ... where its greedy next token is the data's
    agree_prob_sum: float = 0.0  # sum of its probability of the data's token
    agree_expected_sum: float = 0.0  # sum of its greedy token's probability
    # the expected acceptance under speculative sampling at T = 1, per slot k: the sum over counted
    # slots of sum_v min(p_target, q_draft), where the target's distribution was known (a KL loss, a
    # held-out pass), and the slots it was summed over
    accept_sum: list[float] = field(default_factory=list)
    # ... and of p_target(the drafter's argmax): the acceptance of a greedy drafter (DraftDeck's and
    # vLLM's draft the argmax) against a target sampling at T = 1, over the same slots
    draft_prob_sum: list[float] = field(default_factory=list)
    accept_total: list[int] = field(default_factory=list)
    loss_sum: float = 0.0  # sum of w * loss (CE, KL or their mix) over counted slots
    weight_sum: float = 0.0  # sum of w over counted slots
    tokens: int = 0  # tokens the target read (for tokens/s)

    def __post_init__(self) -> None:
        b = self.block_size
        for name, n in (
            ("correct", b),
            ("total", b),
            ("accept_total", b),
            ("anchor_hist", b + 1),
            ("walked_hist", b + 1),
            ("target_walked_hist", b + 1),
        ):
            if not getattr(self, name):
                setattr(self, name, [0] * n)
        if not self.accept_sum:
            self.accept_sum = [0.0] * b
        if not self.draft_prob_sum:
            self.draft_prob_sum = [0.0] * b

    def _ints(self) -> list[int]:
        head = [
            self.anchor_accepted,
            self.anchor_blocks,
            self.walked_accepted,
            self.walked_steps,
            self.tokens,
            self.target_walked_accepted,
            self.target_walked_steps,
            self.agree_tokens,
            self.agree_matches,
        ]
        hists = self.anchor_hist + self.walked_hist + self.target_walked_hist
        return head + self.correct + self.total + self.accept_total + hists

    def to_tensors(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        ints = torch.tensor(self._ints(), dtype=torch.int64, device=device)
        floats = torch.tensor(
            [
                self.loss_sum,
                self.weight_sum,
                self.agree_prob_sum,
                self.agree_expected_sum,
                *self.accept_sum,
                *self.draft_prob_sum,
            ],
            dtype=torch.float64,
            device=device,
        )
        return ints, floats

    @classmethod
    def from_tensors(cls, block_size: int, ints: torch.Tensor, floats: torch.Tensor) -> Counts:
        v = [int(x) for x in ints.tolist()]
        b = block_size
        c = cls(block_size, anchor_accepted=v[0], anchor_blocks=v[1], walked_accepted=v[2], walked_steps=v[3])
        c.tokens = v[4]
        c.target_walked_accepted, c.target_walked_steps, c.agree_tokens, c.agree_matches = v[5:9]
        rest = v[9:]
        c.correct, c.total, c.accept_total = rest[:b], rest[b : 2 * b], rest[2 * b : 3 * b]
        h = 3 * b
        c.anchor_hist, c.walked_hist = rest[h : h + b + 1], rest[h + b + 1 : h + 2 * b + 2]
        c.target_walked_hist = rest[h + 2 * b + 2 :]
        f = [float(x) for x in floats.tolist()]
        c.loss_sum, c.weight_sum, c.agree_prob_sum, c.agree_expected_sum = f[:4]
        c.accept_sum, c.draft_prob_sum = f[4 : 4 + b], f[4 + b :]
        return c

    def __add__(self, other: Counts) -> Counts:
        if other.block_size != self.block_size:
            raise ValueError(f"cannot add counts of block sizes {self.block_size} and {other.block_size}")
        a, fa = self.to_tensors()
        b, fb = other.to_tensors()
        return Counts.from_tensors(self.block_size, a + b, fa + fb)

    # Ratios, for display only.
    @property
    def loss(self) -> float:
        return self.loss_sum / self.weight_sum if self.weight_sum else float("nan")

    @property
    def tau_walked(self) -> float:
        """tau incl. bonus, as decoding walks: 1 + accepted / verify steps."""
        return 1 + self.walked_accepted / self.walked_steps if self.walked_steps else float("nan")

    @property
    def tau_target_walked(self) -> float:
        """tau incl. bonus of the walk over the target's own greedy answers: the estimate of real
        greedy tau whoever wrote the data."""
        if not self.target_walked_steps:
            return float("nan")
        return 1 + self.target_walked_accepted / self.target_walked_steps

    @property
    def agreement(self) -> Agreement:
        return Agreement(self.agree_tokens, self.agree_matches, self.agree_prob_sum, self.agree_expected_sum)

    def add_agreement(self, a: Agreement) -> None:
        self.agree_tokens += a.tokens
        self.agree_matches += a.matches
        self.agree_prob_sum += a.prob_sum
        self.agree_expected_sum += a.expected_sum

    def add_target_walk(self, walked: Counts) -> None:
        """Take the walk of `walked` (a pass over the target's own answers) as the target-judged walk."""
        self.target_walked_accepted += walked.walked_accepted
        self.target_walked_steps += walked.walked_steps
        self.target_walked_hist = [
            a + b for a, b in zip(self.target_walked_hist, walked.walked_hist, strict=True)
        ]

    @property
    def tau_anchor(self) -> float:
        """The mean over anchors of 1 + leading correct run (optimistic)."""
        return 1 + self.anchor_accepted / self.anchor_blocks if self.anchor_blocks else float("nan")

    def accuracy(self, k: int) -> float:
        return self.correct[k] / self.total[k] if self.total[k] else float("nan")

    def position_metrics(self, prefix: str) -> dict[str, float]:
        """`{prefix}/pos/{k}/correct` and `/total` for k = 1..B-1, and `/accept_sum` and
        `/draft_prob_sum` and `/accept_total` where the target's distribution was known."""
        out: dict[str, float] = {}
        for k in range(1, self.block_size):
            out[f"{prefix}/pos/{k}/correct"] = self.correct[k]
            out[f"{prefix}/pos/{k}/total"] = self.total[k]
            if self.accept_total[k]:
                out[f"{prefix}/pos/{k}/accept_sum"] = self.accept_sum[k]
                out[f"{prefix}/pos/{k}/draft_prob_sum"] = self.draft_prob_sum[k]
                out[f"{prefix}/pos/{k}/accept_total"] = self.accept_total[k]
        return out

    def heldout_metrics(self) -> dict[str, float]:
        """Every held-out metric point of `draftdeck.jobs.context` (counts, and the loss)."""
        out = {
            "heldout/loss": self.loss,
            "heldout/walked/accepted": self.walked_accepted,
            "heldout/walked/steps": self.walked_steps,
            "heldout/anchor/accepted": self.anchor_accepted,
            "heldout/anchor/blocks": self.anchor_blocks,
            **self.truth_metrics("heldout"),
        }
        out.update({f"heldout/hist/{n}": self.walked_hist[n] for n in range(1, self.block_size + 1)})
        out.update(self.position_metrics("heldout"))
        return out

    def source_metrics(self, source: str) -> dict[str, float]:
        """One source's walks and agreement, ``heldout/source/<source>/...``."""
        prefix = f"heldout/source/{source}"
        out: dict[str, float] = {
            f"{prefix}/walked/accepted": self.walked_accepted,
            f"{prefix}/walked/steps": self.walked_steps,
        }
        out.update(self.truth_metrics(prefix))
        return out

    def index_figures(self, matched: Counts | None = None) -> dict[str, float]:
        """What a checkpoint's index entry records of its held-out pass (the eval job compares them
        with real decoding); `matched`: the data-judged walk over just the rows whose prompts the
        target answered (the target-judged walk's prompts)."""
        out = {} if matched is None else {
            "heldout_matched_walked_accepted": matched.walked_accepted,
            "heldout_matched_walked_steps": matched.walked_steps,
        }  # fmt: skip
        return out | {
            "heldout_walked_accepted": self.walked_accepted,
            "heldout_walked_steps": self.walked_steps,
            "heldout_target_walked_accepted": self.target_walked_accepted,
            "heldout_target_walked_steps": self.target_walked_steps,
            "heldout_agreement_tokens": self.agree_tokens,
            "heldout_agreement_matches": self.agree_matches,
            "heldout_agreement_prob_sum": self.agree_prob_sum,
            "heldout_agreement_expected_sum": self.agree_expected_sum,
        }

    def truth_metrics(self, prefix: str) -> dict[str, float]:
        """The target-judged walk and agreement counts under `prefix` (``heldout``, ``preflight``, or a
        source's ``heldout/source/<name>``), each when measured."""
        out: dict[str, float] = {}
        if self.target_walked_steps:
            out[f"{prefix}/target_walked/accepted"] = self.target_walked_accepted
            out[f"{prefix}/target_walked/steps"] = self.target_walked_steps
        if not self.agree_tokens:
            return out
        out |= {
            f"{prefix}/agreement/tokens": self.agree_tokens,
            f"{prefix}/agreement/matches": self.agree_matches,
            f"{prefix}/agreement/prob_sum": self.agree_prob_sum,
            f"{prefix}/agreement/expected_sum": self.agree_expected_sum,
        }
        return out
