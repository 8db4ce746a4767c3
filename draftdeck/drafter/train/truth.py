"""Drafter truth: is the training data the target's own output, and what will decoding really get.

The live tau of a run walks the held-out *data* (draftdeck.drafter.train.walked): it is real greedy tau
only when the data is the target's own greedy output. On another model's answers it measures how
well the drafter predicts that model, and overstated real tau by ~39 % here (docs/train.md). Two
measurements tell the cases apart, both stored as counts:

- **Target agreement** on the data, teacher-forced: the target's LM head on its last hidden state
  gives at each trained position t its greedy next token and its probability of the data's token.
  Counted: trained tokens, tokens where the greedy token is the data's (`matches`), the sum of the
  probability of the data's token (`prob_sum`) and the sum of the greedy token's probability
  (`expected_sum`: the agreement the target's own samples at temperature 1 would have). The target's
  own greedy answers agree ~100 %; its own sampled answers agree less, but never much less than its
  temperature-1 samples would; data that disagrees well beyond that (`disagreement_ratio`) is not
  its output.
- **The target-judged walk**: the same walk over the target's own greedy answers to held-out prompts
  (`target_turns`, generated once before step 1, every assistant turn on policy: each after the
  target's own earlier answers): what greedy decoding will accept. It stayed
  within 3 % of real tau on the target's own answers, its sampled answers and another model's
  answers alike (docs/train.md), where judging the data's tokens by the target's greedy token in the
  data's context (a teacher-forced target-judged walk) stayed 16 % above it on another model's.

The LM head is applied only at trained positions, in chunks, so the full (T, V) logits never exist.
It is checked once per pass against the logits the model itself returned for the last position:
an architecture whose logits are not ``lm_head(last hidden)`` (soft-capping, scaling) is refused by
name rather than measured wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from draftdeck.drafter.model.target import Target
from draftdeck.drafter.model.vision import RowImage
from draftdeck.errors import DraftDeckError

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (input_ids, attention_mask, loss_mask)

OFF_TARGET = "data_not_target_output"  # the alert: the data is not the target's output

# Rows of the LM head computed at once: (rows, V) float32 logits, ~256 MiB for a 248K vocabulary.
HEAD_ELEMENTS = 1 << 26


class TruthUnavailable(DraftDeckError):
    """The target's next-token view cannot be computed from its last hidden state."""


@dataclass
class TargetView:
    """The target's teacher-forced view of trained positions, (bsz, T) each: `greedy` its argmax
    next token (-1 where not computed), `prob` its probability of the data's token and `top` the
    probability of its greedy token (0 there), `computed` where they are set (trained t >= 1)."""

    greedy: torch.Tensor
    prob: torch.Tensor
    top: torch.Tensor
    computed: torch.Tensor


def _check_head(head: nn.Module, last_hidden: torch.Tensor, last_logits: torch.Tensor) -> None:
    want = last_logits[:, -1].float()
    got = head(last_hidden[:, -1]).float()
    scale = want.abs().amax().clamp(min=1.0)
    if not torch.allclose(got, want, atol=float(2e-2 * scale), rtol=2e-2):
        raise TruthUnavailable(
            "the target's LM head on its last hidden state does not give the logits the model returns "
            f"(largest difference {float((got - want).abs().max()):.4g}): target agreement and the "
            "target-judged tau cannot be measured for this architecture"
        )


@torch.no_grad()
def target_view(
    head: nn.Module,
    last_hidden: torch.Tensor,
    last_logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
) -> TargetView:
    """The view at every trained position t >= 1, from ``head(last_hidden[:, t - 1])``.

    `last_hidden` (bsz, T, H): the target's final hidden states (after its final norm) over
    `input_ids`; `last_logits` (bsz, 1, V): what the model returned for the last position, against
    which the head is checked."""
    _check_head(head, last_hidden, last_logits)
    bsz, t = input_ids.shape
    computed = loss_mask.bool().clone()
    computed[:, 0] = False
    rows, cols = computed.nonzero(as_tuple=True)
    greedy = torch.full((bsz, t), -1, dtype=torch.long, device=input_ids.device)
    prob = torch.zeros((bsz, t), dtype=torch.float32, device=input_ids.device)
    top = torch.zeros_like(prob)
    vocab = int(last_logits.shape[-1])
    step = max(1, HEAD_ELEMENTS // max(vocab, 1))
    for i in range(0, len(rows), step):
        r, c = rows[i : i + step], cols[i : i + step]
        probs = torch.softmax(head(last_hidden[r, c - 1]).float(), dim=-1)
        top[r, c], greedy[r, c] = probs.max(-1)
        prob[r, c] = probs.gather(1, input_ids[r, c][:, None])[:, 0]
    return TargetView(greedy, prob, top, computed)


@dataclass
class Agreement:
    """Counts over trained tokens: `matches` where the target's greedy token is the data's,
    `prob_sum` the sum of the target's probability of the data's token, `expected_sum` the sum of
    its greedy token's probability (the matches its own temperature-1 samples would have)."""

    tokens: int = 0
    matches: int = 0
    prob_sum: float = 0.0
    expected_sum: float = 0.0

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(
            self.tokens + other.tokens,
            self.matches + other.matches,
            self.prob_sum + other.prob_sum,
            self.expected_sum + other.expected_sum,
        )

    @property
    def share(self) -> float:
        """Greedy agreement: matches / tokens (display only)."""
        return self.matches / self.tokens if self.tokens else float("nan")

    @property
    def mean_prob(self) -> float:
        """The mean probability the target gives the data's token (display only)."""
        return self.prob_sum / self.tokens if self.tokens else float("nan")

    @property
    def expected(self) -> float:
        """The agreement of the target's own samples at temperature 1 on these contexts."""
        return self.expected_sum / self.tokens if self.tokens else float("nan")

    @property
    def disagreement_ratio(self) -> float:
        """How many times more often the data differs from the target's greedy token than the
        target's own temperature-1 samples would: ~0 for its greedy answers, below 1 for its samples
        at temperature < 1, ~1 at temperature 1; above 1: not its output (or sampled hotter)."""
        if not self.tokens:
            return float("nan")
        expected = self.tokens - self.expected_sum
        return (self.tokens - self.matches) / expected if expected > 0 else float("inf")


def agreement_of(view: TargetView, input_ids: torch.Tensor, rows: torch.Tensor | None = None) -> Agreement:
    """Agreement over the computed positions (of the rows `rows` selects, a (bsz,) bool, if given)."""
    sel = view.computed if rows is None else view.computed & rows[:, None]
    return Agreement(
        tokens=int(sel.sum()),
        matches=int(((view.greedy == input_ids) & sel).sum()),
        prob_sum=float(view.prob[sel].double().sum()),
        expected_sum=float(view.top[sel].double().sum()),
    )


@torch.no_grad()
def agreement_pass(target: Target, batches: Iterable[Batch], layer_ids: Sequence[int]) -> Agreement:
    """Target agreement over `batches` of (input_ids, attention_mask, loss_mask): no drafter needed
    (the pre-flight, before step 1)."""
    total = Agreement()
    for input_ids, attention_mask, loss_mask in batches:
        tf = target.teacher_forced(input_ids, attention_mask, list(layer_ids))
        view = target_view(target.lm_head, tf.last_hidden, tf.last_logits, input_ids, loss_mask)
        total = total + agreement_of(view, input_ids)
    return total


def off_target(agreement: Agreement, max_ratio: float) -> bool:
    """The data reads as another writer's: it differs from the target's greedy token more than
    `max_ratio` times as often as the target's own temperature-1 samples would."""
    return agreement.tokens > 0 and agreement.disagreement_ratio > max_ratio


def describe(agreement: Agreement) -> str:
    """The agreement in words for the job log and the alert: what was compared and what each figure is."""
    return (
        f"the target's own greedy choice of next token is the data's token on {agreement.share:.1%} of "
        f"{agreement.tokens:,} trained tokens, where its own samples at temperature 1 would match its "
        f"greedy choice on {agreement.expected:.1%}: the data departs from the target's greedy choice "
        f"{agreement.disagreement_ratio:.2f} times as often as those samples would (0 when the data is the "
        "target's greedy output, about 1 when it is the target's output sampled at temperature 1, well "
        "above 1 when another model or person wrote it), and the target gives the data's tokens a mean "
        f"probability of {agreement.mean_prob:.3f}"
    )


@torch.no_grad()
def target_answers(
    target: Target,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    *,
    batch_size: int = 16,
    images: Sequence[Sequence[RowImage]] | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The target's own greedy answers to `prompts`, as (ids, loss_mask) rows (prompt + answer, the
    answer trained, its stop token included as decoding commits it); each at most its
    `max_new_tokens`. Batched generation with left padding (prompts of a batch share one call).
    `images`: each prompt's row's images, for a target that reads them (draftdeck.drafter.model.vision)."""
    eos = set(target.eos_ids())
    pad = getattr(target.tokenizer, "pad_token_id", None)
    pad = int(pad) if pad is not None else min(eos)
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths, less padding
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for at in range(0, len(order), batch_size):
        part = order[at : at + batch_size]
        width = max(len(prompts[i]) for i in part)
        ids = torch.full((len(part), width), pad, dtype=torch.long)
        att = torch.zeros((len(part), width), dtype=torch.long)
        for r, i in enumerate(part):
            ids[r, width - len(prompts[i]) :] = torch.tensor(list(prompts[i]))
            att[r, width - len(prompts[i]) :] = 1
        new = target.model.generate(
            input_ids=ids.to(target.device),
            attention_mask=att.to(target.device),
            max_new_tokens=max(max_new_tokens[i] for i in part),
            do_sample=False,
            eos_token_id=sorted(eos),
            pad_token_id=pad,
            synced_gpus=target.sharded,  # every rank steps until all are done: each step gathers layers
            # prompts with images: their pixels at the prefill
            **target.vision_inputs(
                ids.to(target.device),
                att.to(target.device),
                None if images is None else [images[i] for i in part],
            ),
        )[:, width:].cpu()
        for r, i in enumerate(part):
            answer = new[r, : max_new_tokens[i]].tolist()
            stop = next((k for k, t in enumerate(answer) if t in eos), None)
            answer = answer if stop is None else answer[: stop + 1]
            p = list(prompts[i])
            out[i] = (
                np.asarray(p + answer, dtype=np.int64),
                np.asarray([0] * len(p) + [1] * len(answer), dtype=np.int64),
            )
    rows = [out[i] for i in range(len(prompts))]
    return rows


def trained_spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of trained tokens of a row's loss mask: its answers, in order."""
    m = np.concatenate([[0], np.asarray(mask, dtype=np.int64) != 0, [0]]).astype(np.int8)
    d = np.diff(m)
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


@torch.no_grad()
def target_turns(
    target: Target,
    rows: Sequence[tuple[np.ndarray, np.ndarray]],
    max_new_tokens: int,
    *,
    batch_size: int = 16,
    images: Sequence[Sequence[RowImage]] | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`images`: each row's, for a target that reads them. The target's own greedy answers to every
    trained turn of `rows` ((ids, loss_mask) each), on
    policy: turn k is generated after the target's own answers to turns 1..k-1, the data's tokens
    between the answers (the end of a turn, the next user message, the next assistant header) kept
    as they are. Each answer is at most as long as the data's answer to that turn (so that the walk
    over the data and the walk over these answers cover the same turns) and `max_new_tokens`. Rows
    whose turns the template renders apart (one trained turn a row) have one turn here too, after
    the data's earlier turns. Returns (ids, loss_mask) rows, the target's answers trained."""
    spans = [trained_spans(mask) for _, mask in rows]
    built: list[list[int]] = [
        ids[: sp[0][0]].tolist() if sp else ids.tolist() for (ids, _), sp in zip(rows, spans, strict=True)
    ]
    masks: list[list[int]] = [[0] * len(b) for b in built]
    for turn in range(max((len(sp) for sp in spans), default=0)):
        todo = [i for i, sp in enumerate(spans) if turn < len(sp)]
        caps = [max(1, min(spans[i][turn][1] - spans[i][turn][0], max_new_tokens)) for i in todo]
        shown = None if images is None else [images[i] for i in todo]
        answered = target_answers(target, [built[i] for i in todo], caps, batch_size=batch_size, images=shown)
        for i, (ids, _) in zip(todo, answered, strict=True):
            answer = ids[len(built[i]) :].tolist()
            built[i] += answer
            masks[i] += [1] * len(answer)
            sp = spans[i]
            if turn + 1 < len(sp):  # the data's tokens up to its next answer
                between = rows[i][0][sp[turn][1] : sp[turn + 1][0]].tolist()
                built[i] += between
                masks[i] += [0] * len(between)
    return [
        (np.asarray(b, dtype=np.int64), np.asarray(m, dtype=np.int64))
        for b, m in zip(built, masks, strict=True)
    ]
