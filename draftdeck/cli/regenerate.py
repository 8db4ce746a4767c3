"""`draftdeck regenerate`: the target model answers the prompts (options from RegenerateParams).

    draftdeck regenerate INPUT... --endpoint URL --model NAME --out PATH [--max-tokens N]
        [--temperature T] [--concurrency N] [--report FILE]        # an OpenAI-compatible server
    draftdeck regenerate INPUT... --local MODEL_DIR --out PATH ...  # transformers, in this process

The servers' key comes from the environment variable `--api-key-env` names (OPENAI_API_KEY), never
from the command line, where it would stay in the shell history. Exit codes: 0 success, 1 the run
failed (policy, empty output, endpoints down), 2 usage errors (bad options, a refused key, an
unknown model).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from draftdeck.cli.common import err, out, print_report, usage_exit
from draftdeck.cli.data import REPORT
from draftdeck.cli.options import job_command
from draftdeck.errors import Cancelled, InputError, JobFailed, UsageError
from draftdeck.jobs.context import LocalContext
from draftdeck.quality import Report
from draftdeck.regenerate.params import RegenerateParams
from draftdeck.units import count


def regenerate(params: RegenerateParams, *, report: Path | None) -> None:
    from draftdeck.regenerate.run import run_regenerate

    target = Path(params.out)
    ctx = LocalContext(out_dir=target.parent)
    try:
        result = run_regenerate(params, ctx)
    except (UsageError, InputError) as exc:
        raise usage_exit(str(exc)) from None
    except (JobFailed, Cancelled) as exc:
        failed = getattr(exc, "report", None)
        if isinstance(failed, Report):
            print_report(failed, f"regenerate -> {target}")
            if report is not None:
                failed.write_json(report)
        err.print(f"[bold red]failed:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    print_report(result, f"regenerate -> {target}")
    if report is not None:
        result.write_json(report)
    regen = result.extra["regenerate"]
    out.print(
        f"wrote {escape(str(target))}: {count(result.rows_out, 'rows')} of {result.rows_in:,} read,"
        f" {count(regen['completion_tokens'], 'tokens')} in {result.extra['elapsed_s']:.1f} s",
        highlight=False,
    )
    # tokenize trains on the target's own ids where they came back (draftdeck.tokenize.target_ids)
    refused = [ep["url"] for ep in regen["endpoints"] if ep.get("return_token_ids") is False]
    out.print(
        f"token ids kept for {regen['answers_with_token_ids']:,} of {count(regen['answers'], 'answers')}"
        + (f" ({', '.join(refused)} does not return them)" if refused else ""),
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("regenerate")(
        job_command(RegenerateParams, regenerate, required=("out",), extra=[REPORT],
                    doc="Have the target model answer every prompt (its own outputs are what a drafter"
                    " must learn): checked, resumable, exactly once, in input order.")
    )  # fmt: skip
