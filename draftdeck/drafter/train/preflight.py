"""The train job's checks: of its inputs before anything is loaded, and of the truth before step 1
and at every held-out pass.

Before the target is loaded (`check_inputs`): every input is a dataset folder `draftdeck tokenize`
wrote (its manifest.json). A chat file, or a folder of them, is refused with the exact tokenize
command to run: loading a 27B target takes minutes, and reading a JSONL file as a folder failed only
after it.

Before step 1 (`run_preflight`):

1. Provenance: the manifests count rows by the model that answered them (draftdeck.provenance); the
   run says how many its target answered ("0 of 1,000 rows were answered by this target"). Rows
   recorded as another local model's are another model's output: the run raises
   `data_not_target_output`. A served model is known only by a name, which proves nothing either way.
2. Target agreement on up to `truth_rows` training rows, teacher-forced (draftdeck.drafter.train.truth),
   as metric points at step 0 (``preflight/agreement/...``). Data that differs from the target's
   greedy token more than `off_target_ratio` times as often as its own temperature-1 samples would
   raises `data_not_target_output` too. With `off_target` "fail" either stops the run.
3. The target's own greedy answers to up to `truth_rows` held-out rows, every assistant turn on
   policy (each as long as the row's answer to that turn at most, and `truth_max_new_tokens`): the
   rows of the target-judged walk.

At every held-out pass (`compare`): the data-judged walk over the held-out rows whose prompts the
target answered, against the walk over its answers; data-judged above by more than `off_target_tolerance`
raises `data_not_target_output` (once a run) with both figures: the data's writer is not the target,
whatever the records and statistics said. Provenance and statistics catch it before step 1 only when
the records say so or the data is far from anything the target writes; another model trained on the
same kind of text reads, token by token, like the target's own samples.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.data import DataError, RowRef, TrainData, collate
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.truth import (
    OFF_TARGET,
    Agreement,
    TruthUnavailable,
    agreement_pass,
    describe,
    off_target,
    target_turns,
)
from draftdeck.errors import InputError, JobFailed
from draftdeck.jobs.context import RunContext
from draftdeck.provenance import Answered, model_fingerprint
from draftdeck.shards.manifest import MANIFEST

Row = tuple[np.ndarray, np.ndarray]


@dataclass
class Verdict:
    """What the pre-flight found. `judge` is False when the target's view cannot be computed (no
    agreement is measured then). `answered`: the target's own answers to `answered_refs`, this
    rank's share of the held-out rows (the rows of the target-judged walk)."""

    judge: bool
    agreement: Agreement | None = None
    provenance: str | None = None
    reasons: list[str] = field(default_factory=list)  # why the data is not the target's output
    alert: str | None = None
    answered_refs: list[RowRef] = field(default_factory=list)
    answered: list[Row] = field(default_factory=list)
    answered_rows: list[list[Any]] = field(default_factory=list)  # every rank's: [dataset folder, row]

    def to_dict(self) -> dict[str, Any]:
        """What run.json keeps (the run page shows it): counts, never ratios."""
        a = self.agreement
        return {
            "provenance": self.provenance,
            "preflight": None if a is None else {"tokens": a.tokens, "matches": a.matches,
                                                  "prob_sum": a.prob_sum, "expected_sum": a.expected_sum},
            "alert": self.alert,
            "reasons": self.reasons,
            "target_answered_prompts": len(self.answered_rows),
            # which held-out rows: an eval of the same split compares real decoding on these prompts
            "target_answered_rows": self.answered_rows,
            "judged": self.judge,
        }  # fmt: skip


def check_inputs(params: TrainParams) -> None:
    """Refuse inputs that are not dataset folders (module doc), naming each and why, before the target
    is loaded; chat data is answered with the `draftdeck tokenize` command that makes a folder of it."""
    problems: list[str] = []
    chat: list[Path] = []  # inputs tokenize reads: the command to run names them
    for text in params.inputs:
        path = Path(text)
        if not path.exists():
            problems.append(f"{path} does not exist")
        elif path.is_file():
            problems.append(f"{path} is a file, not a dataset folder")
            chat.append(path)
        elif not (path / MANIFEST).is_file():
            problems.append(
                f"{path} has no {MANIFEST}: not a dataset folder `draftdeck tokenize` wrote (or its job"
                " has not finished)"
            )
            if _holds_chat_data(path):
                chat.append(path)
    if not problems:
        return
    said = "; ".join(problems) + (
        ". Train reads the folders `draftdeck tokenize` writes (token ids and loss masks, tokenized with"
        " the target's chat template)"
    )
    if chat:
        out = chat[0].parent / f"{chat[0].name.split('.')[0] or 'data'}-tokens"
        words = ["draftdeck", "tokenize", *map(str, chat), "--tokenizer", params.target, "--out", str(out)]
        said += (
            f". Tokenize {'it' if len(chat) == 1 else 'them'} first: {shlex.join(words)}; then train on"
            f" {shlex.quote(str(out))}"
        )
    raise DataError(said)


def _holds_chat_data(folder: Path) -> bool:
    """Whether `draftdeck tokenize` reads anything in `folder` (chat files, a save_to_disk folder)."""
    from draftdeck.formats.tables import expand_inputs

    try:
        return bool(expand_inputs(folder))
    except InputError:
        return False


def fix_text(params: TrainParams) -> str:
    return (
        "The live tau judged by the data will overstate real decoding; the tau on the target's own "
        "answers estimates it. Fix: regenerate the answers with this target (draftdeck regenerate "
        f"--local {params.target}, or 'Regenerate with this target' on the job page), then tokenize "
        "and train again"
    )


def _other_models(answered: Answered, fingerprint: str) -> int:
    """Rows recorded as answered by a local model other than the target (served names prove nothing)."""
    return sum(n for m, n in answered.by if m.fingerprint is not None and m.fingerprint != fingerprint)


@dataclass(frozen=True)
class OnRank:
    """What the checks read of the run on one rank: the target and data, the context layers, the pad
    id, which rank of how many, how counts are summed over ranks, and the block size."""

    target: Target
    data: TrainData
    layer_ids: Sequence[int]
    pad_id: int
    rank: int
    world: int
    reduce: Callable[[Counts], Counts]
    block_size: int


def run_preflight(params: TrainParams, ctx: RunContext, on: OnRank, *, fresh: bool) -> Verdict:
    """The checks before step 1, on every rank (each its share of the rows; counts reduced, so every
    rank reaches one verdict). Rank 0 records. `fresh` False (a resumed run): only the target's
    answers are made again (they are not saved); what was recorded at the start stands."""
    verdict = Verdict(judge=True)
    reasons = verdict.reasons
    data, lead = on.data, on.rank == 0
    if fresh and on.target.folder is not None:
        answered = data.provenance()
        fp = model_fingerprint(on.target.folder)
        verdict.provenance = answered.versus(fp)
        if lead:
            ctx.event("info", f"provenance: {verdict.provenance}")
        other = _other_models(answered, fp)
        if other:
            reasons.append(f"{other:,} of {answered.rows:,} rows are recorded as another model's answers")
    if fresh and params.truth_rows:
        try:
            verdict.agreement = _agreement(params, ctx, on)
        except TruthUnavailable as exc:
            verdict.judge = False
            if lead:
                ctx.event("warning", f"target agreement is not measured: {exc}", code="truth_unavailable")
        got = verdict.agreement
        if got is not None and off_target(got, params.off_target_ratio):
            reasons.append(f"above off_target_ratio {params.off_target_ratio:g}")
    if reasons:
        figures = describe(verdict.agreement) if verdict.agreement and verdict.agreement.tokens else ""
        parts = [
            f"the data is not this target's output: {'; '.join(reasons)}",
            figures,
            verdict.provenance or "",
        ]
        said = [p for p in parts if p] + [fix_text(params)]
        verdict.alert = ". ".join([said[0]] + [p[0].upper() + p[1:] for p in said[1:]])
        if lead:
            ctx.alert(OFF_TARGET, verdict.alert)
        if params.off_target == "fail":
            raise JobFailed(
                f"{OFF_TARGET}: {verdict.alert} (off_target is 'fail': the run stopped before step 1)"
            )
    if params.truth_rows:
        picked = data.heldout[: min(params.truth_rows, params.heldout_max_rows)]
        verdict.answered_refs = picked[on.rank :: on.world]
        verdict.answered_rows = [[str(data.paths[r.dataset].resolve()), r.row] for r in picked]
        verdict.answered = _answers(params, on.target, data, verdict.answered_refs)
    return verdict


def _agreement(params: TrainParams, ctx: RunContext, on: OnRank) -> Agreement:
    rows = on.data.sample(params.truth_rows)
    mine = rows[on.rank :: on.world]
    bs = params.eval_batch_size
    batches = [
        collate([on.data.example(r) for r in mine[i : i + bs]], on.pad_id, on.target.device)
        for i in range(0, len(mine), bs)
    ]
    c = Counts(on.block_size)
    c.add_agreement(agreement_pass(on.target, batches, on.layer_ids))
    c = on.reduce(c)
    if on.rank == 0 and c.agree_tokens:
        ctx.metrics(0, c.truth_metrics("preflight"))
        ctx.event("info", f"pre-flight on {len(rows):,} training rows: {describe(c.agreement)}")
    return c.agreement


def _answers(params: TrainParams, target: Target, data: TrainData, refs: list[RowRef]) -> list[Row]:
    """The target's greedy answers to every trained turn of `refs`, on policy (each turn after its
    own earlier answers), each at most as long as the row's answer to that turn (so that both walks
    cover the same turns) and `truth_max_new_tokens`."""
    rows = [data.example(ref) for ref in refs]
    images = [data.images_of(ref) for ref in refs] if target.vision is not None else None
    answers = target_turns(
        target, rows, params.truth_max_new_tokens, batch_size=params.eval_batch_size, images=images
    )
    if target.vision is not None and images is not None:  # the walk over them finds their pictures
        for (ids, _), shown in zip(answers, images, strict=True):
            if shown:
                target.vision.rows.bind(ids, shown)
    return answers


def compare(data_judged: Counts, target_judged: Counts, params: TrainParams, step: int) -> str | None:
    """The alert message when the data-judged walk over the rows the target answered is above the
    walk over the target's answers by more than `off_target_tolerance`, else None."""
    d, t = data_judged.tau_walked, target_judged.tau_walked
    if not (np.isfinite(d) and np.isfinite(t)) or t <= 0 or (d - t) / t <= params.off_target_tolerance:
        return None
    agree = data_judged.agreement
    figures = f"; on those rows {describe(agree)}" if agree.tokens else ""
    return (
        f"the data is not this target's output: at step {step:,} the held-out walked tau judged by the "
        f"data is {d:.3f} incl. bonus, but {t:.3f} on the target's own answers to the same "
        f"prompts ({(d - t) / t:.0%} above, more than off_target_tolerance "
        f"{params.off_target_tolerance:.0%}){figures}. {fix_text(params)}"
    )
