"""The job kinds: each one's name, queue, parameter model, run function and summary.

This is the routing table, at the top of the core: it imports every kind's parameter model, and
nothing in the core imports it (only the CLI and app/). A kind's queue decides which workers may take
it (`gpu` for training, evaluation and local generation; `cpu` for everything else).

Every kind is found the same way: its parameter model (imported here: the CLI and the forms are built
from it) and its run function, named as ``"module:function"`` and imported only when a job of that kind
runs (training and evaluation import torch; a web process listing kinds must not). A new kind is one
parameter model and one run function in its stage's package, and one line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from draftdeck.convert.job import ConvertParams
from draftdeck.convert.scan_job import ScanParams
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.eval.sweep_params import SweepParams
from draftdeck.drafter.export.params import ExportParams
from draftdeck.drafter.tiny_job import TinyTargetParams
from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.drafter.train.params import TrainParams
from draftdeck.jobs.context import RunContext
from draftdeck.jobs.params import JobParams
from draftdeck.mix.job import MixParams
from draftdeck.quality import Report
from draftdeck.regenerate.params import RegenerateParams
from draftdeck.tokenize.job import TokenizeParams

QUEUES = ("cpu", "gpu")


def _regenerate_queue(params: RegenerateParams) -> str:
    return "gpu" if params.local else "cpu"


@dataclass(frozen=True)
class JobKind:
    name: str
    queue: str
    params: type[JobParams]
    runner: str  # "module:function", imported when a job of this kind runs
    summary: str
    # The queue a job of this kind goes to when it depends on the parameters (local generation needs a
    # gpu worker, generation through a server does not); `queue` otherwise.
    route: Callable[[Any], str] | None = None

    def queue_for(self, params: JobParams) -> str:
        return self.route(params) if self.route is not None else self.queue

    def run(self, params: Any, ctx: RunContext) -> Report:
        module, function = self.runner.split(":")
        run: Callable[[Any, RunContext], Report] = getattr(importlib.import_module(module), function)
        return run(params, ctx)


KINDS: dict[str, JobKind] = {
    k.name: k
    for k in (
        JobKind("scan", "cpu", ScanParams, "draftdeck.convert.scan_job:run",
                "Pre-flight: rows, bytes, parse errors and key sets of data files"),
        JobKind("convert", "cpu", ConvertParams, "draftdeck.convert.job:run",
                "Convert chat data (shapes detected per row) to OpenAI, ShareGPT or Parquet"),
        JobKind("mix", "cpu", MixParams, "draftdeck.mix.job:run",
                "Mix named sources by quota or weight into one file: deduplicated, every row counted"),
        JobKind("regenerate", "cpu", RegenerateParams, "draftdeck.regenerate.run:run_regenerate",
                "The target answers the prompts (a server or a local model): checked, resumable, in order",
                route=_regenerate_queue),
        JobKind("tokenize", "cpu", TokenizeParams, "draftdeck.tokenize.job:run",
                "Tokenize with the target's chat template into Arrow shards with exact loss masks"),
        JobKind("train", "gpu", TrainParams, "draftdeck.drafter.train.run:run_train",
                "Train a DFlash or EAGLE-3 drafter on tokenized datasets against its frozen target"
                " (resumable)"),
        JobKind("eval", "gpu", EvalParams, "draftdeck.drafter.eval.evaluate:run_eval",
                "Real speculative decoding of a drafter checkpoint: tau incl. bonus, baselines, lossless"),
        JobKind("sweep", "gpu", SweepParams, "draftdeck.drafter.eval.sweep:run_sweep",
                "A drafter evaluated at every point of a grid of eval options: tau against tokens/s, the"
                " Pareto front, the flags to serve"),
        JobKind("cache-hidden", "gpu", CacheParams, "draftdeck.drafter.train.cache.job:run_cache_hidden",
                "The target's hidden states of a tokenized dataset, once, as a checked cache train reads"),
        JobKind("export-drafter", "cpu", ExportParams, "draftdeck.drafter.export.params:run_export",
                "Export a drafter checkpoint (or a run's best) to z-lab's format for vLLM and SGLang"),
        JobKind("tiny-target", "cpu", TinyTargetParams, "draftdeck.drafter.tiny_job:run_tiny_target",
                "Build a tiny trained target (tokenizer, model, prompts) to try the whole path on a CPU"),
    )
}  # fmt: skip


def get_kind(name: str) -> JobKind:
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown job kind {name!r}; known kinds: {', '.join(sorted(KINDS))}") from None
