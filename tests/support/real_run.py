"""Real tiny runs for the page tests: run.json, checkpoints/index.json, the metric points and an eval's
eval.json as the trainer and the eval write them (run_train, run_eval on CPU, seconds each), not as a
test imagines them. tests/support/run.py's hand-written records cannot notice a field the writers
renamed or never wrote; these can."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session

from app.store.metrics import record_points
from app.store.models import Job
from draftdeck.jobs.context import LocalContext, MetricPoint

DRAFT_VOCAB = "<v>.npz"  # an EAGLE-3 run's draft vocabulary file: a name the pages must escape


@dataclass
class RealRun:
    params: dict[str, Any]  # the train job's parameters; `out`: the run's folder
    points: list[MetricPoint]  # what the trainer reported
    eval_params: dict[str, Any]  # an eval of the run's best checkpoint; `out`: its eval.json's folder
    # an EAGLE-3 run's draft vocabulary's share of the training split's trained tokens, counted here
    draft_vocab_coverage: float | None = None


@dataclass
class RealWorld:
    """A tiny saved target and a dataset of its own greedy answers, for runs of any drafter kind."""

    root: Path
    target: Path
    dataset: Path


def real_world(root: Path) -> RealWorld:
    from tests.support.drafter import greedy_rows, saved_target, write_dataset

    target = saved_target(root / "target", hidden=32, layers=2)
    dataset = write_dataset(root / "ds", greedy_rows(target, 24, gen_len=24), target)
    return RealWorld(root, target, dataset)


def real_run(world: RealWorld, name: str, **train: Any) -> RealRun:
    """Train a tiny run of `train`'s options (a few steps, a checkpoint every two) and evaluate its
    best checkpoint on a few held-out prompts. An EAGLE-3 run drafts over DRAFT_VOCAB, the training
    split's 20 most frequent trained tokens."""
    from draftdeck.drafter.eval.evaluate import run_eval
    from draftdeck.drafter.eval.params import EvalParams
    from draftdeck.drafter.train.data import TrainData
    from draftdeck.drafter.train.params import TrainParams
    from draftdeck.drafter.train.run import run_train
    from draftdeck.shards.tools import vocab_of_counts, write_draft_vocab

    root = world.root / name
    root.mkdir(parents=True)
    coverage = None
    if train.get("drafter") == "eagle3" and "draft_vocab" not in train:
        vocab_size = int(json.loads((world.target / "config.json").read_text())["vocab_size"])
        counts = TrainData([world.dataset], heldout_fraction=0.15).trained_token_counts(vocab_size)
        vocab = vocab_of_counts(counts, 20)
        write_draft_vocab(vocab, root / DRAFT_VOCAB)
        train["draft_vocab"] = str(root / DRAFT_VOCAB)
        coverage = vocab.coverage
    params = TrainParams(
        inputs=[str(world.dataset)], target=str(world.target), out=str(root / "run"), batch_size=4,
        max_steps=4, checkpoint_every=2, eval_every=2, log_every=1, heldout_fraction=0.15, device="cpu",
        **train,
    )  # fmt: skip
    ctx = LocalContext(root / "ctx")
    run_train(params, ctx)
    evaluation = EvalParams(
        checkpoint=str(root / "run"), target=str(world.target), inputs=[str(world.dataset)],
        out=str(root / "eval"), max_prompts=3, max_new_tokens=12, heldout_fraction=0.15, device="cpu",
    )  # fmt: skip
    run_eval(evaluation, LocalContext(root / "ectx"))
    return RealRun(
        params.model_dump(mode="json"), list(ctx.points), evaluation.model_dump(mode="json"), coverage
    )


def add_real_run(session: Session, run: RealRun) -> tuple[int, int]:
    """The run as a succeeded train job with its metric points, and its eval as a succeeded eval job:
    (train job id, eval job id). Both jobs' folders are the real ones (their `out` parameters)."""
    job = Job(kind="train", params=run.params, status="succeeded", queue="gpu")
    session.add(job)
    session.commit()
    assert job.id is not None
    record_points(session, job.id, run.points)
    ev = Job(kind="eval", params=run.eval_params, status="succeeded", queue="gpu")
    session.add(ev)
    session.commit()
    assert ev.id is not None
    return job.id, ev.id
