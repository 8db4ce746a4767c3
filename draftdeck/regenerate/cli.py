"""`draftdeck regenerate` (a Typer command function; the CLI mounts it with
``app.command("regenerate")(regenerate_command)``).

    draftdeck regenerate INPUT... (--endpoint URL... --model NAME | --local MODEL_DIR) --out PATH
        [--max-tokens N] [--temperature T] [--top-p P] [--seed N] [--concurrency N] [--timeout S]
        [--retries N] [--no-reasoning] [--keep-cut-off] [--report FILE]

Exit codes: 0 success, 1 the job failed (policy, empty output, every endpoint down), 2 usage (bad
options, a refused key, an unknown model). The API key comes from --api-key or $OPENAI_API_KEY.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from draftdeck.errors import Cancelled, JobFailed, UsageError


def regenerate_command(
    inputs: Annotated[list[Path], typer.Argument(help="prompt or chat files of any shape convert reads")],
    out: Annotated[Path, typer.Option("--out", help="output OpenAI messages JSONL")],
    endpoint: Annotated[
        list[str] | None, typer.Option("--endpoint", help="OpenAI-compatible base URL (repeat: round-robin)")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="model name the server lists")] = None,
    local: Annotated[Path | None, typer.Option("--local", help="generate with this model folder")] = None,
    device: Annotated[str, typer.Option("--device", help="torch device for --local")] = "cpu",
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY", show_default=False)
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 1024,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, max=2.0)] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0)] = 1.0,
    seed: Annotated[int | None, typer.Option("--seed", min=0)] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 8,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per request")] = 120.0,
    retries: Annotated[int, typer.Option("--retries", min=0)] = 4,
    reasoning: Annotated[bool, typer.Option("--reasoning/--no-reasoning")] = True,
    template_kwargs: Annotated[
        str | None, typer.Option("--chat-template-kwargs", help="JSON object for the chat template")
    ] = None,
    keep_cut_off: Annotated[
        bool, typer.Option("--keep-cut-off", help="keep answers cut at max tokens (warned)")
    ] = False,
    report: Annotated[Path | None, typer.Option("--report", help="write the JSON report here")] = None,
) -> None:
    """Have the target model answer every prompt; checked, resumable, in input order."""
    from draftdeck.jobs.context import LocalContext
    from draftdeck.regenerate.params import RegenerateParams
    from draftdeck.regenerate.run import run_regenerate

    try:
        params = RegenerateParams(
            inputs=[str(p) for p in inputs],
            out=str(out),
            endpoints=endpoint or [],
            model=model,
            local=str(local) if local else None,
            device=device,
            api_key=api_key,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            concurrency=concurrency,
            timeout_s=timeout,
            retries=retries,
            reasoning=reasoning,
            chat_template_kwargs=json.loads(template_kwargs) if template_kwargs else {},
            keep_cut_off=keep_cut_off,
        )
    except (ValidationError, json.JSONDecodeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    ctx = LocalContext(out_dir=out.parent if str(out.parent) else Path("."))
    try:
        result = run_regenerate(params, ctx)
    except UsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (JobFailed, Cancelled) as exc:
        typer.echo(f"failed: {exc}", err=True)
        failed = getattr(exc, "report", None)
        if report is not None and failed is not None:
            failed.write_json(report)
        raise typer.Exit(1) from None
    if report is not None:
        result.write_json(report)
    regen = result.extra["regenerate"]
    typer.echo(
        f"wrote {out}: {result.rows_out:,} rows of {result.rows_in:,} read, {result.rows_rejected:,} rejected"
        f" ({', '.join(f'{c} {n}' for c, n in result.rejected.most_common()) or 'none'});"
        f" {regen['completion_tokens']:,} tokens in {result.extra['elapsed_s']:.1f}s"
    )
