"""The target's own token ids: an answer's recorded ids in place of its re-encoded text.

Regenerate records the ids the target produced for each answer (``Message.token_ids``) and the
vocabulary they belong to (``generation.token_ids.vocab``). Encoding the answer's text again can split
words otherwise than the target did (BPE is not unique: the target may write "hel" + "lo" where the
tokenizer writes "hello"), and a drafter trained on those ids learns a stream the target never
produces. So each trained span of a row takes its answer's recorded ids when

- the ids were recorded in the vocabulary in use (a server's ids carry no vocabulary: the decode check
  below stands alone for them);
- they decode to the span's rendered text (else the template renders the answer otherwise than the
  target wrote it: a reasoning block the target did not write, a row edited since), up to whitespace
  around the answer that the answer parser stripped (the target wrote it, so its ids keep it); the
  end-of-turn token the template writes after the answer is added where the recorded ids stop before
  it (an ordinary stop token, or a server that leaves the stop token out);
- the row encoded from text has token boundaries at both ends of the span, so the ids replace whole
  tokens of it.

Spliced spans are trained whole, as the encoded span was. A row whose every trained answer took its
ids is counted ``ids_from_target`` (and noted on the row); a row with recorded ids that could not all
be used is counted ``ids_reencoded`` and warned with the first reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftdeck.chat.spans import RenderedRow
from draftdeck.quality import Report

# A row note (the row's codes, not a warning): its answers' tokens are the target's own ids.
FROM_TARGET = "ids_from_target"
REENCODED = "ids_reencoded"


@dataclass
class Splice:
    lo: int  # the first token of the span in the row encoded from text
    hi: int  # past its last token
    ids: list[int]  # the recorded ids that replace tokens lo..hi


@dataclass
class Plan:
    """What one row does with its answers' recorded ids."""

    splices: list[Splice] = field(default_factory=list)
    spans: set[int] = field(default_factory=set)  # indices of the spliced spans
    recorded: int = 0  # trained spans whose answer has recorded ids
    reason: str | None = None  # why the first span with recorded ids was not spliced

    @property
    def path(self) -> str | None:
        """FROM_TARGET, REENCODED, or None: no trained answer of the row has recorded ids."""
        if not self.recorded:
            return None
        return FROM_TARGET if len(self.spans) == self.recorded else REENCODED

    def count(self, report: Report, file: str, line: int | None) -> str | None:
        """Count the kept row's path (rows and answers) into `report`, warn a fallback; the path."""
        path = self.path
        if path is None:
            return None
        report.counts[path] += 1
        kept, lost = len(self.spans), self.recorded - len(self.spans)
        for key, n in (("answers_ids_from_target", kept), ("answers_ids_reencoded", lost)):
            if n:
                report.counts[key] += n
        if lost:
            report.warn(
                REENCODED, file, line, f"{lost} of {self.recorded} answers encoded from text: {self.reason}"
            )
        return path


def _bounds(r: RenderedRow, starts: np.ndarray, span: tuple[int, int]) -> tuple[int, int] | None:
    """The tokens [lo, hi) covering exactly `span` of the text, or None when a token crosses an end."""
    s, e = span
    n = len(starts)
    lo, hi = np.searchsorted(starts, [s, e], side="left").tolist()
    if lo >= n or int(starts[lo]) != s:
        return None
    if (hi < n and int(starts[hi]) != e) or (hi == n and e != len(r.text)):
        return None
    return lo, hi


def _fit(ids: list[int], got: str, want: str, end_tokens: dict[str, int]) -> list[int] | str:
    """The ids that stand for rendered span `want`, given they decode to `got`; or why they cannot."""
    if got == want:
        return ids
    end = next((t for t in end_tokens if t and want.endswith(t)), None)
    body = want[: -len(end)] if end else want
    tail = [] if end is None or got.endswith(end) else [end_tokens[end]]
    if got.removesuffix(end or "").strip() == body.strip() and body.strip():
        return [*ids, *tail]
    hint = (
        ": the template renders a reasoning block the target did not write (tokenize with the template"
        " settings regenerate used, enable_thinking)"
        if "</think>" in want and "</think>" not in got
        else ""
    )
    return f"its ids decode to {got[:60]!r} but the rendered answer is {want[:60]!r}{hint}"


def plan_rows(
    rendered: list[RenderedRow],
    starts: list[np.ndarray],
    answers: list[dict[int, list[int]]],
    vocab_ok: list[str | None],
    decode: Any,
    end_tokens: dict[str, int],
) -> list[Plan]:
    """A :class:`Plan` per row. `answers[k]`: row k's recorded ids by message index; `vocab_ok[k]`:
    None when the ids' vocabulary is usable, else why not; `decode`: ids lists -> texts, in one batch;
    `end_tokens`: the added tokens by their text (an end-of-turn the recorded ids may stop before)."""
    plans = [Plan() for _ in rendered]
    asks: list[tuple[int, int, tuple[int, int], list[int]]] = []  # row, span index, span, ids
    for k, r in enumerate(rendered):
        if not answers[k]:
            continue
        plan = plans[k]
        for j, (span, msg) in enumerate(zip(r.spans, r.answers, strict=True)):
            ids = answers[k].get(msg)
            if ids is None:
                continue
            plan.recorded += 1
            if vocab_ok[k] is not None:
                plan.reason = plan.reason or vocab_ok[k]
            else:
                asks.append((k, j, span, ids))
    texts = decode([ids for *_, ids in asks]) if asks else []
    for (k, j, span, ids), got in zip(asks, texts, strict=True):
        r, plan = rendered[k], plans[k]
        fitted = _fit(ids, got, r.text[span[0] : span[1]], end_tokens)
        if isinstance(fitted, str):
            plan.reason = plan.reason or f"answer {j + 1}: {fitted}"
            continue
        where = _bounds(r, starts[k], span)
        if where is None:
            plan.reason = plan.reason or f"answer {j + 1}: the text's tokens cross the answer's ends"
            continue
        plan.splices.append(Splice(*where, fitted))
        plan.spans.add(j)
    return plans


def apply(plan: Plan, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row's ids and mask with each spliced span's tokens replaced by its recorded ids (trained)."""
    if not plan.splices:
        return ids, mask
    out_ids: list[np.ndarray] = []
    out_mask: list[np.ndarray] = []
    at = 0
    for sp in sorted(plan.splices, key=lambda s: s.lo):
        out_ids += [ids[at : sp.lo], np.asarray(sp.ids, dtype=ids.dtype)]
        out_mask += [mask[at : sp.lo], np.ones(len(sp.ids), dtype=mask.dtype)]
        at = sp.hi
    out_ids.append(ids[at:])
    out_mask.append(mask[at:])
    return np.concatenate(out_ids), np.concatenate(out_mask)
