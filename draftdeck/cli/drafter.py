"""`draftdeck train`, `eval` and `export-drafter`: the drafter's commands, run in this process.

    draftdeck train DATASET... --target DIR --out RUN [--block-size 16] [--layers 1] [--max-steps N] ...
    draftdeck eval PROMPTS --target DIR --checkpoint RUN|CKPT [--mode greedy|sampled] [--out DIR]
    draftdeck export-drafter RUN|CKPT --out DIR

Options are the `train` and `eval` job kinds' parameters (draftdeck/drafter/train/params.py,
eval_params.py): the same names in the CLI, the JSON API and the form. Every tau printed counts the
bonus token, as vLLM does. Exit codes: 0 success, 1 the run failed (NaN loss, policy), 2 usage errors.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from draftdeck.cli.common import err, out, usage_exit
from draftdeck.cli.data import REPORT
from draftdeck.cli.options import job_command, option
from draftdeck.drafter.eval.params import EvalParams
from draftdeck.drafter.export.params import ExportParams
from draftdeck.drafter.tiny_job import TinyTargetParams
from draftdeck.drafter.train.params import PlanParams, TrainParams
from draftdeck.errors import DraftDeckError, InputError, JobFailed, UsageError
from draftdeck.jobs.context import LocalContext
from draftdeck.quality import Report
from draftdeck.run_provenance import cli_command
from draftdeck.units import binary_size, count, short_count

PRINT_EVERY_SECONDS = 2.0
JSON = option("as_json", bool, False, "--json", help="print the plan as JSON")
REPORT_TO = option(
    "report_to", str | None, None, metavar="URL",
    help="a DraftDeck server to report this run to live (its token in DRAFTDECK_TOKEN), for a run"
    " launched outside the job system (torchrun, srun)",
)  # fmt: skip


@dataclass
class ConsoleContext(LocalContext):
    """A LocalContext that also prints a line per training point (at most one per 2 s) and every
    held-out evaluation, so a terminal run shows its curve as it goes."""

    _last_print: float = field(default=0.0, repr=False)

    def metrics(self, step: int, values: Mapping[str, float], *, tokens: int | None = None) -> None:
        super().metrics(step, values, tokens=tokens)
        if values.get("heldout/walked/steps"):
            err.print(f"step {step:>7,}  {_heldout_line(values)}", highlight=False)
        elif values.get("preflight/agreement/tokens"):
            err.print(f"pre-flight  {_agreement_words(values, 'preflight')}", highlight=False)
        elif "train/loss" in values and time.monotonic() - self._last_print >= PRINT_EVERY_SECONDS:
            self._last_print = time.monotonic()
            err.print(
                f"step {step:>7,}  loss {values['train/loss']:.4f}  lr {values.get('train/lr', 0):.2e}"
                f"  {values.get('train/tokens_per_s', 0):,.0f} tok/s",
                highlight=False,
            )

    def event(self, level: str, message: str, *, code: str | None = None, count: int = 1) -> None:
        super().event(level, message, code=code, count=count)
        if level in ("warning", "error"):  # the job page's log shows every event; a terminal, these
            err.print(f"[yellow]{escape(level)}:[/] {escape(message)}", highlight=False)

    def alert(self, kind: str, message: str) -> None:
        super().alert(kind, message)
        err.print(f"[bold yellow]alert {escape(kind)}:[/] {escape(message)}", highlight=False)


def _ratio(values: Mapping[str, float], num: str, den: str, offset: float = 0.0) -> float:
    d = values.get(den) or 0
    return offset + values.get(num, 0) / d if d else math.nan


def _agreement_words(values: Mapping[str, float], prefix: str) -> str:
    agree = _ratio(values, f"{prefix}/agreement/matches", f"{prefix}/agreement/tokens")
    prob = _ratio(values, f"{prefix}/agreement/prob_sum", f"{prefix}/agreement/tokens")
    return f"target agreement {agree:.1%} (mean p {prob:.3f})"


def _heldout_line(values: Mapping[str, float]) -> str:
    """One held-out pass: tau judged by the target and by the data (both incl. bonus), the optimistic
    anchor mean, target agreement, the loss and the pass's wall time."""
    walked = _ratio(values, "heldout/walked/accepted", "heldout/walked/steps", 1.0)
    judged = _ratio(values, "heldout/target_walked/accepted", "heldout/target_walked/steps", 1.0)
    anchor = _ratio(values, "heldout/anchor/accepted", "heldout/anchor/blocks", 1.0)
    line = f"held-out tau incl. bonus: judged by the target {judged:.3f}, by the data {walked:.3f}"
    line += f" (anchor-mean, optimistic: {anchor:.3f})"
    if values.get("heldout/agreement/tokens"):
        line += f"  {_agreement_words(values, 'heldout')}"
    line += f"  loss {values.get('heldout/loss', math.nan):.4f}"
    seconds = values.get("heldout/seconds")
    if seconds is not None:
        line += f"  (the pass: {seconds:.2f} s)" if seconds < 10 else f"  (the pass: {seconds:,.0f} s)"
    return line


def _run(
    work: Any, params: Any, title: str, report_path: Path | None, ctx: ConsoleContext | None = None
) -> Report:
    """Run `work(params, ctx)` with a console context (a new one unless given); exit 1 on a failed run,
    2 on usage errors."""
    ctx = ctx or ConsoleContext(Path(params.out) if params.out else Path.cwd())
    try:
        with cli_command():  # a run it starts records this command line (draftdeck.run_provenance)
            report: Report = work(params, ctx)
    except JobFailed as exc:
        err.print(f"[bold red]failed:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    except (InputError, UsageError) as exc:
        raise usage_exit(str(exc)) from None
    except DraftDeckError as exc:
        err.print(f"[bold red]failed:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    if report_path:
        report.write_json(report_path)
    out.print(
        f"[bold]{escape(title)}[/]: {count(report.rows_in, 'rows')} in, {report.rows_out:,} used, "
        f"{report.rows_rejected:,} rejected",
        highlight=False,
    )
    for code, n in sorted(report.rejected.items()):  # what was left out, and why, with an example
        examples = report.examples.get(code) or []
        ex = examples[0] if examples else None
        where = "" if ex is None else f": {ex.file}{'' if ex.line is None else f':{ex.line}'}: {ex.reason}"
        out.print(f"  [yellow]rejected {code}[/] {n:,}{escape(where)}", highlight=False)
    return report


def tiny_target(params: TinyTargetParams) -> None:
    from draftdeck.drafter.tiny_job import run_tiny_target

    report = _run(run_tiny_target, params, f"tiny-target {params.arch}", None)
    out.print(
        f"target: {escape(report.extra['target'])} (its tokenizer beside it); prompts: "
        f"{escape(str(Path(str(params.out)) / 'prompts.jsonl'))}",
        highlight=False,
        soft_wrap=True,
    )


def train(params: TrainParams, *, report: Path | None, report_to: str | None) -> None:
    from draftdeck.drafter.train.launched import Launched
    from draftdeck.drafter.train.run import run_train

    def work(p: TrainParams, ctx: ConsoleContext) -> Report:
        return run_train(p, ctx, report_to=report_to)

    where = Launched.from_env()
    if where is not None and where.rank != 0:  # one of a launcher's ranks: rank 0 speaks for the run
        run_train(params, LocalContext(Path(str(params.out))))
        return
    result = _run(work, params, f"train -> {params.out}", report)
    extra = result.extra
    out.print(
        f"{extra['steps']:,} steps; best checkpoint: step {extra['best_step']}; run record {extra['run']}",
        highlight=False,
    )


# Records a finished eval where the dashboard reads evals (app/cli/evals.py) and says where: given by
# the `draftdeck` console, absent from the core's own CLI (which knows nothing of the service).
EvalRecorder = Callable[[EvalParams, Report, LocalContext, float], str]
RECORD = option(
    "record", bool, True, "--record/--no-record",
    help="record the finished eval in this home's database (DRAFTDECK_HOME or DATABASE_URL), where the"
    " dashboard's leaderboard (/evals) and the run's page list it",
)  # fmt: skip


def evaluate(params: EvalParams, *, report: Path | None, recorder: EvalRecorder | None = None) -> None:
    from draftdeck.drafter.eval.evaluate import run_eval

    if params.out is None:
        raise usage_exit("--out is required: the folder for eval.json")
    started = time.time()
    ctx = ConsoleContext(Path(params.out))
    result = _run(run_eval, params, f"eval {params.checkpoint}", report, ctx)
    ev = result.extra["eval"]
    # two conventions of one decode: vLLM's counters (a bonus every step) and z-lab's benchmark
    head = ("method", "tau (vLLM)", "tok/step (z-lab)", "accept", "tok/s", "lossless")
    out.print("{:<14} {:>10} {:>16} {:>7} {:>7} {:>8}".format(*head))
    for name, m in ev["methods"].items():
        out.print(
            f"{name:<14} {_num(m['tau_incl_bonus_pooled'], '.3f'):>10}"
            f" {_num(m.get('tokens_per_step'), '.3f'):>16}"
            f" {_num(m['acceptance_rate'], '.3f'):>7}"
            f" {_num(m['tokens_per_s'], ',.0f'):>7} {m['lossless']!s:>8}",
            highlight=False,
        )
    out.print(
        "tau (vLLM): 1 + accepted / verify steps, a bonus token on every step, as vLLM's counters;"
        " tok/step (z-lab): tokens each step added, no bonus past a stop, as z-lab's benchmark",
        highlight=False,
    )
    if ev.get("suites"):
        _print_suites(ev)
    walked = _num(ev["walked"]["tau_incl_bonus"], ".3f")
    zlab = _num(ev["walked"].get("tokens_per_step"), ".3f")
    out.print(f"walked over these outputs (the decoder check): tau {walked} (vLLM), {zlab} tok/step (z-lab)",
              highlight=False)  # fmt: skip
    training = ev.get("training")
    if training:
        out.print(
            f"the run's held-out tau at step {training['checkpoint_step']}: judged by the target "
            f"{_num(training['target_judged_tau_incl_bonus'], '.3f')}, judged by the data "
            f"{_num(training['data_judged_tau_incl_bonus'], '.3f')} (real: "
            f"{_num(training['real_tau_incl_bonus'], '.3f')})",
            highlight=False,
        )
    served = ev.get("served")
    if served:  # the three numbers of one drafter on these prompts
        traffic = " (other requests were served meanwhile: not exact)" if served.get("other_traffic") else ""
        out.print(
            f"served by {served['url']} ({served['kind']}): tau {_num(served['tau_incl_bonus'], '.3f')}"
            f" over {served['prompts']} prompts{traffic}; offline real tau "
            f"{_num(served['offline_real_tau_incl_bonus'], '.3f')}, walked "
            f"{_num(served['walked_tau_incl_bonus'], '.3f')}",
            highlight=False,
        )
    out.print(f"wrote {Path(params.out) / 'eval.json'}", highlight=False)
    if recorder is not None:
        out.print(escape(recorder(params, result, ctx, started)), highlight=False, soft_wrap=True)


def _print_suites(ev: dict[str, Any]) -> None:
    """The drafter per suite and category, each turn of a multi-turn prompt counted, in both conventions."""
    kwargs = ev.get("template_kwargs") or {}
    said = ", ".join(f"{k}={json.dumps(v)}" for k, v in kwargs.items()) or "the template's defaults"
    out.print(f"\nper suite and category (the drafter; prompts rendered with {said}):", highlight=False)
    from draftdeck.drafter.eval.keys import ALL

    served = (ev.get("served") or {}).get("by_category") or {}
    head = (
        "suite",
        "category",
        "turns",
        "tau",
        "tok/step",
        "accept",
        "speed-up",
        "served" if served else "lossless",
    )
    out.print("{:<11} {:<15} {:>5} {:>6} {:>8} {:>6} {:>8} {:>8}".format(*head))
    for suite, cats in ev["suites"].items():
        for cat, fig in cats.items():
            m = fig["methods"]["drafter"]
            if served:  # the served drafter's tau on the same turns
                whole = ev["served"] if cat == ALL else served.get(suite, {}).get(cat, {})
                last = _num(whole.get("tau_incl_bonus"), ".3f")
            else:
                last = str(m["lossless"])
            out.print(
                f"{suite[:11]:<11} {cat[:15]:<15} {fig['turns']:>5}"
                f" {_num(m['tau_incl_bonus_pooled'], '.3f'):>6} {_num(m.get('tokens_per_step'), '.3f'):>8}"
                f" {_num(m['acceptance_rate'], '.3f'):>6}"
                f" {_num(m.get('speedup_vs_target_only'), '.2f'):>8} {last:>8}",
                highlight=False,
            )
    out.print("tau as vLLM counts (a bonus every step), tok/step as z-lab's benchmark; each turn counted",
              highlight=False)  # fmt: skip


def _num(value: float | None, spec: str) -> str:
    """A figure for the table; eval.json stores a ratio with no denominator as null."""
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def plan(params: PlanParams, *, as_json: bool) -> None:
    from draftdeck.drafter.kinds import get_kind
    from draftdeck.drafter.train.plan import describe, to_json
    from draftdeck.drafter.train.plan_advice import plan_for

    try:
        result = plan_for(params)
    except DraftDeckError as exc:
        raise usage_exit(str(exc)) from None
    if as_json:
        print(to_json(result))
        if not result.fits:
            raise typer.Exit(1)
        return
    world = result.shape.world
    kind, per_row = get_kind(result.drafter).planned(result)
    said = f" ({result.config_from})" if result.config_from else ""
    out.print(
        f"target {result.target}{said}: {short_count(result.target_params)} parameters; {kind}: "
        f"{short_count(result.trainable_params)} trainable",
        highlight=False,
    )
    out.print(
        f"{world} rank{'s' if world > 1 else ''} ({params.nodes} x {params.devices}) of "
        f"{params.device_memory}, {params.dtype}; rows of {params.seq_length:,} tokens, batch "
        f"{params.batch_size}, held-out batch {params.eval_batch_size}, {per_row}",
        highlight=False,
    )
    if result.cache_disk is not None:  # --hidden-states: the run from a cache, and the cache
        out.print(
            "from a hidden-state cache: the target's embedding and LM head in memory, not its decoder"
            f" layers (no fsdp); {escape(result.cache_disk.said())}",
            highlight=False,
            soft_wrap=True,
        )
    rows = describe(result)
    width = max(len(r[0]) for r in rows)
    for row in rows:
        out.print(f"{row[0]:<{width}}" + "".join(f" {cell:>14}" for cell in row[1:]), highlight=False)
    if not result.fits:  # exit 1: no run of this shape fits; each lever alone that would
        least = min(result.strategies.items(), key=lambda kv: kv[1].per_rank)
        out.print(
            f"[bold red]nothing fits[/] {params.device_memory} per device: the least a rank needs is"
            f" {binary_size(least[1].per_rank)}{f' ({least[0]})' if world > 1 else ''}. What would, each"
            " alone:",
            highlight=False,
        )
        for advice in result.advice:
            out.print(f"  {escape(advice.said)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    name, why = result.auto
    out.print(f"auto: {name} ({why})", highlight=False)
    if any(s.phase == "held-out pass" and not s.fits for s in result.strategies.values()):
        out.print("the held-out pass sets the peak: lower --eval-batch-size", highlight=False)


def export_drafter(params: ExportParams) -> None:
    from draftdeck.drafter.export.params import run_export
    from draftdeck.drafter.kinds import get_kind

    if params.out is None:
        raise usage_exit("--out is required: the new folder the drafter is written to")
    report = _run(run_export, params, f"export {params.inputs[0]}", None)
    hf = json.loads((Path(params.out) / "config.json").read_text())
    kind, fmt = get_kind(report.extra["drafter"]), report.extra["format"]
    said = kind.export_summary(hf)
    out.print(
        f"wrote {escape(params.out)} in {kind.format_names[fmt]}: {escape(said)}",
        highlight=False,
        soft_wrap=True,
    )
    if params.target is None and report.extra.get("target"):
        said = f"the target: {report.extra['target']} (the run's record names it; --target names another)"
        out.print(escape(said), highlight=False, soft_wrap=True)
    if report.extra.get("trained_on"):
        t = report.extra["trained_on"]
        said = f"trained on {t['data']}: {t['rows_with_images']} of {t['rows']} rows with images"
        out.print(escape(said), highlight=False, soft_wrap=True)
    out.print("As each server's loader reads it (draftdeck/drafter/kinds/):", highlight=False)
    for r in report.extra["served"]:
        out.print(f"  {escape(kind.reading_line(r))}", highlight=False, soft_wrap=True)
        out.print(f"    {escape(r['flags'])}", highlight=False, soft_wrap=True)
        for problem in r["problems"]:
            out.print(
                f"    [yellow]warning served_config:[/] {escape(problem)}", highlight=False, soft_wrap=True
            )
    for line in report.extra.get("vlm_serving") or []:
        out.print(escape(line), highlight=False, soft_wrap=True)


EVAL_DOC = (
    "Real speculative decoding of a checkpoint with its target on held-out prompts, or per category of the"
    " suites papers report (--suite): tau incl. bonus, acceptance, speed, lossless check, and the baselines."
)


def register(app: typer.Typer, record_eval: EvalRecorder | None = None) -> None:
    """The drafter's commands; `record_eval` (the service's) adds --record/--no-record to `eval`."""
    app.command("train")(
        job_command(TrainParams, train, required=("out",), extra=[REPORT, REPORT_TO],
                    doc="Train (or resume) a drafter (DFlash, EAGLE-3, DFlash2 or DSpark: --drafter) on"
                    " DraftDeck datasets against its frozen target; checkpoints, held-out walked tau (incl."
                    " bonus) as it goes.")
    )  # fmt: skip
    if record_eval is None:
        app.command("eval")(
            job_command(EvalParams, evaluate, required=("out",), extra=[REPORT], doc=EVAL_DOC)
        )
    else:

        def evaluate_and_record(params: EvalParams, *, report: Path | None, record: bool) -> None:
            evaluate(params, report=report, recorder=record_eval if record else None)

        app.command("eval")(
            job_command(EvalParams, evaluate_and_record, required=("out",), extra=[REPORT, RECORD],
                        doc=EVAL_DOC + " Recorded in this home's database for the dashboard.")
        )  # fmt: skip
    app.command("tiny-target")(
        job_command(TinyTargetParams, tiny_target, required=("out",),
                    doc="Build a tiny trained target (a tokenizer, a Qwen3 or Qwen3.5 hybrid model, and"
                    " prompts it never saw) to try the whole path on a CPU; every kind takes it as a target.")
    )  # fmt: skip
    app.command("plan")(
        job_command(PlanParams, plan, extra=[JSON],
                    doc="Per-rank peak memory of a train job for each sharding, from the target's config"
                    " alone (no weights read): whether it fits and the largest batch that does."),
    )  # fmt: skip
    app.command("export-drafter")(
        job_command(ExportParams, export_drafter, required=("out",),
                    doc="Export a drafter checkpoint (or a train run's best) in a format vLLM and SGLang"
                    " load: DFlash in z-lab's, EAGLE-3 in speculators' or SGLang's flat one (--format);"
                    " prints how each server reads it and the flags that launch it.")
    )  # fmt: skip
