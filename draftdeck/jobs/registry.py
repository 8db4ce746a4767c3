"""The job kinds: each one's name, queue, parameter model, run function and summary.

This is the routing table: a kind's queue decides which workers may take it (`gpu` for training,
evaluation and local generation; `cpu` for everything else). A new kind is one parameter model and
one run function in its own module, and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from draftdeck.drafter import eval_params, export_params
from draftdeck.drafter import params as train_params
from draftdeck.jobs import convert, mix, scan, tokenize
from draftdeck.jobs.context import RunContext
from draftdeck.jobs.params import JobParams
from draftdeck.quality import Report
from draftdeck.regenerate import params as regen_params

QUEUES = ("cpu", "gpu")


def _run_regenerate(params: regen_params.RegenerateParams, ctx: RunContext) -> Report:
    from draftdeck.regenerate.run import run_regenerate

    return run_regenerate(params, ctx)


def _regenerate_queue(params: regen_params.RegenerateParams) -> str:
    return "gpu" if params.local else "cpu"


def _run_train(params: train_params.TrainParams, ctx: RunContext) -> Report:
    from draftdeck.drafter.run import run_train  # imports torch: only where a run trains

    return run_train(params, ctx)


def _run_eval(params: eval_params.EvalParams, ctx: RunContext) -> Report:
    from draftdeck.drafter.evaluate import run_eval  # imports torch: only where an eval runs

    return run_eval(params, ctx)


@dataclass(frozen=True)
class JobKind:
    name: str
    queue: str
    params: type[JobParams]
    run: Callable[[Any, RunContext], Report]
    summary: str
    # The queue a job of this kind goes to when it depends on the parameters (local generation needs a
    # gpu worker, generation through a server does not); `queue` otherwise.
    route: Callable[[Any], str] | None = None

    def queue_for(self, params: JobParams) -> str:
        return self.route(params) if self.route is not None else self.queue


KINDS: dict[str, JobKind] = {
    k.name: k
    for k in (
        JobKind("scan", "cpu", scan.ScanParams, scan.run,
                "Pre-flight: rows, bytes, parse errors and key sets of data files"),
        JobKind("convert", "cpu", convert.ConvertParams, convert.run,
                "Convert chat data (shapes detected per row) to OpenAI, ShareGPT or Parquet"),
        JobKind("mix", "cpu", mix.MixParams, mix.run,
                "Mix named sources by quota or weight into one file: deduplicated, every row counted"),
        JobKind("regenerate", "cpu", regen_params.RegenerateParams, _run_regenerate,
                "The target answers the prompts (a server or a local model): checked, resumable, in order",
                route=_regenerate_queue),
        JobKind("tokenize", "cpu", tokenize.TokenizeParams, tokenize.run,
                "Tokenize with the target's chat template into Arrow shards with exact loss masks"),
        JobKind("train", "gpu", train_params.TrainParams, _run_train,
                "Train a DFlash drafter on tokenized datasets against its frozen target (resumable)"),
        JobKind("eval", "gpu", eval_params.EvalParams, _run_eval,
                "Real speculative decoding of a drafter checkpoint: tau incl. bonus, baselines, lossless"),
        JobKind("export-drafter", "cpu", export_params.ExportParams, export_params.run_export,
                "Export a drafter checkpoint (or a run's best) to z-lab's format for vLLM and SGLang"),
    )
}  # fmt: skip


def get_kind(name: str) -> JobKind:
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown job kind {name!r}; known kinds: {', '.join(sorted(KINDS))}") from None
