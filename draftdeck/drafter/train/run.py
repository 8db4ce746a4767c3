"""The `train` job's run function, and the entry point that trains in one process or N ranks.

Apart from the trainer so that imports run one way: params <- trainer <- distributed <- run.
"""

from __future__ import annotations

from pathlib import Path

from draftdeck.drafter.train.cache.first import cache_first
from draftdeck.drafter.train.distributed import Launched, launch, run_launched
from draftdeck.drafter.train.params import TrainParams
from draftdeck.drafter.train.preflight import check_inputs
from draftdeck.drafter.train.reporter import Reporter
from draftdeck.drafter.train.run_record import RunRecord
from draftdeck.drafter.train.trainer import Trainer
from draftdeck.errors import Cancelled, crash_message
from draftdeck.fileio import sha256_file
from draftdeck.jobs.context import RunContext
from draftdeck.quality import Output, Report


def train(params: TrainParams, ctx: RunContext) -> RunRecord:
    """Train (or resume) a drafter as `params` says: as one rank of the run a launcher started
    (torchrun, srun), N ranks of its own when `params.devices` > 1, else in this process."""
    check_inputs(params)  # before any target is loaded: a chat file is refused in a second, not minutes
    where = Launched.from_env()
    params = cache_first(params, ctx, launched=where is not None)  # --hidden-states-cache: built once
    if where is not None:
        return run_launched(params, ctx, where)
    if params.devices > 1:
        return launch(params, ctx)
    return Trainer(params, ctx).run()


def run_train(params: TrainParams, ctx: RunContext, *, report_to: str | None = None) -> Report:
    """The `train` job's run function: train (or resume), then account for the rows. `report_to`: a
    DraftDeck server this run reports to live (rank 0 only; draftdeck/drafter/train/reporter.py),
    for a run launched outside the job system.

    rows_in = rows read; rows_out = rows used (training + held-out split, see `extra`); rows with
    no DFlash anchor are counted under `rejected["no_dflash_anchor"]`. Outputs: the last
    checkpoint's weights and run.json, both artifacts (no rows: rows_out is what was trained and judged on).
    """
    if params.out is None:  # a job without `out` trains into its own folder (Retry resumes there)
        params = params.model_copy(update={"out": str(ctx.out_dir)})
    where = Launched.from_env()
    if not report_to or (where is not None and where.rank != 0):
        return _account(params, train(params, ctx))
    world = where.world if where is not None else params.devices
    shown = params.model_dump(mode="json") | {"devices": world}  # the launcher's world, on the job page
    reporter = Reporter(report_to, Path(str(params.out)), shown, world, ctx)
    try:
        report = _account(params, train(params, reporter))
    except Cancelled as exc:
        reporter.end("cancelled", str(exc))
        raise
    except BaseException as exc:
        reporter.end("failed", crash_message(exc))  # worded as a worker's failure is
        raise
    said = f"{report.extra['steps']:,} steps, best checkpoint: step {report.extra['best_step']}"
    # the artifacts' paths are the run's machine's: the server keeps the figures, not the paths
    reporter.end("succeeded", said, {**report.to_dict(), "outputs": []})
    return report


def _account(params: TrainParams, record: RunRecord) -> Report:
    """The run's report: rows read, used and left out, the last checkpoint and run.json as artifacts."""
    data = record.data
    report = Report(rows_in=data["rows_in"], rows_out=data["train_rows"] + data["heldout_rows"])
    if data["no_anchor_rows"]:
        report.rejected["no_dflash_anchor"] = data["no_anchor_rows"]
    if data.get("truncated_rows"):  # kept, cut at seq_length: the job page says how much was cut
        report.warn(
            "truncated", ", ".join(data["inputs"]), None,
            f"{data['truncated_rows']} rows longer than seq_length {params.seq_length}: "
            f"{data['truncated_tokens']} tokens past it are not trained",
            n=data["truncated_rows"],
        )  # fmt: skip
    out = Path(str(params.out))
    if record.checkpoints:
        weights = Path(max(record.checkpoints)) / "model.safetensors"
        report.outputs.append(
            Output(str(weights), 0, weights.stat().st_size, sha256_file(weights), kind="artifact")
        )
    run_json = out / "run.json"
    report.outputs.append(
        Output(str(run_json), 0, run_json.stat().st_size, sha256_file(run_json), kind="artifact")
    )
    report.extra = {
        "train_rows": data["train_rows"],
        "heldout_rows": data["heldout_rows"],
        "steps": record.steps_done,
        "best_step": record.best_step,
        "checkpoints": record.checkpoints,
        "run": str(run_json),
    }
    report.check_accounting()
    return report
