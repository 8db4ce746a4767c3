"""`draftdeck tokenize`, `inspect`, `vocab`, `export` (registered into draftdeck.cli).

    draftdeck tokenize INPUT... --tokenizer DIR --out DIR [--chat-template FILE] [-k enable_thinking=false]
        [--seq-length N] [--truncation right|drop] [--on-missing error|drop] [--shard-rows N]
        [--report FILE] [--verify-all] [--strict] [--encoder auto|hf|tiktoken] [--workers N]
    draftdeck inspect DATASET --row N [--tokenizer DIR]
    draftdeck vocab DATASET --top K --out FILE(.npz|.json)
    draftdeck export DATASET --format speculators-jsonl --out FILE

Exit codes: 0 success, 1 the job ran but failed its policy, 2 usage errors.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from draftdeck.errors import InputError, UsageError


class Truncation(StrEnum):
    right = "right"
    drop = "drop"


class OnMissing(StrEnum):
    error = "error"
    drop = "drop"


class EncoderChoice(StrEnum):
    auto = "auto"
    hf = "hf"
    tiktoken = "tiktoken"


class ExportFormat(StrEnum):
    speculators_jsonl = "speculators-jsonl"


def parse_template_kwargs(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; VALUE is JSON when it parses (true, 3, "x"), else the plain string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"--template-kwarg takes KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def tokenize_command(
    inputs: Annotated[list[Path], typer.Argument(help="chat data files (any shape `convert` reads)")],
    tokenizer: Annotated[
        Path, typer.Option("--tokenizer", help="local folder of the target model's tokenizer")
    ],
    out: Annotated[Path, typer.Option("--out", help="new dataset folder (Arrow shards + manifest)")],
    chat_template: Annotated[
        Path | None, typer.Option("--chat-template", help="Jinja file replacing the tokenizer's template")
    ] = None,
    template_kwarg: Annotated[
        list[str] | None,
        typer.Option(
            "--template-kwarg", "-k", help="template variable KEY=VALUE, e.g. enable_thinking=false"
        ),
    ] = None,
    seq_length: Annotated[
        int | None, typer.Option("--seq-length", min=2, help="maximum tokens per row")
    ] = None,
    truncation: Annotated[
        Truncation, typer.Option("--truncation", help="rows over --seq-length: cut on the right, or drop")
    ] = Truncation.right,
    on_missing: Annotated[
        OnMissing, typer.Option("--on-missing", help="rows without an assistant turn: fail the job, or drop")
    ] = OnMissing.error,
    shard_rows: Annotated[int, typer.Option("--shard-rows", min=1, help="rows per Arrow shard")] = 10_000,
    report: Annotated[Path | None, typer.Option("--report", help="write the JSON report here")] = None,
    verify_all: Annotated[
        bool, typer.Option("--verify-all", help="check every row of the fast encoder against HF")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="every warning fails the job")] = False,
    encoder: Annotated[EncoderChoice, typer.Option("--encoder", help="token encoder")] = EncoderChoice.auto,
    workers: Annotated[int, typer.Option("--workers", min=0, help="processes (0: one per core)")] = 0,
) -> None:
    """Tokenize conversations with the target's chat template into Arrow shards with exact loss masks."""
    from draftdeck.cli import _confine, _usage_exit, run_in_process
    from draftdeck.cli import out as console
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files

    paths = [_confine(p) for p in inputs]
    try:
        opts = TokenizeOptions(
            tokenizer=tokenizer,
            chat_template=chat_template,
            template_kwargs=parse_template_kwargs(template_kwarg or []),
            seq_length=seq_length,
            truncation=truncation.value,  # type: ignore[arg-type]
            on_missing=on_missing.value,  # type: ignore[arg-type]
            shard_rows=shard_rows,
            verify_all=verify_all,
            strict=strict,
            encoder=encoder.value,  # type: ignore[arg-type]
            workers=workers,
        )
        opts.check()
    except UsageError as exc:
        raise _usage_exit(str(exc)) from None
    result = run_in_process(
        f"tokenize -> {out}",
        f"tokenize {len(paths)} input{'s' if len(paths) != 1 else ''}",
        lambda progress: tokenize_files(paths, out, opts, progress=progress),
        report,
    )
    enc = result.extra.get("encoder", {})
    console.print(
        f"encoder: {enc.get('used')} ({enc.get('verified_rows', 0):,} rows checked against HF)"
        + (f" - {enc['note']}" if enc.get("note") else ""),
        highlight=False,
    )
    console.print(
        f"tokens: {result.extra.get('tokens', 0):,}, trained {result.extra.get('trained_tokens', 0):,}"
        f" in {result.extra.get('seconds', 0)} s",
        highlight=False,
    )
    for o in result.outputs:
        console.print(
            f"wrote {o.path}: {o.rows:,} rows, {o.bytes:,} bytes, sha256 {o.sha256[:16]}", highlight=False
        )


def _open_dataset(dataset: Path) -> Any:
    from draftdeck.cli import _usage_exit
    from draftdeck.shards.store import ShardDataset

    try:
        return ShardDataset(dataset)
    except InputError as exc:
        raise _usage_exit(str(exc)) from None


def inspect_command(
    dataset: Annotated[Path, typer.Argument(help="dataset folder written by `draftdeck tokenize`")],
    row: Annotated[int, typer.Option("--row", min=0, help="row number (0-based)")] = 0,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="tokenizer folder (default: the one in the manifest)")
    ] = None,
) -> None:
    """Print one row's tokens: trained tokens in green, context dimmed; whitespace and specials visible."""
    from draftdeck.chat.render import load_tokenizer
    from draftdeck.cli import _usage_exit
    from draftdeck.cli import out as console
    from draftdeck.shards.inspect import render_row

    ds = _open_dataset(dataset)
    try:
        data = ds.row(row)
        tok = load_tokenizer(tokenizer or ds.manifest.tokenizer_dir())
    except (IndexError, InputError, UsageError) as exc:
        raise _usage_exit(str(exc)) from None
    console.print(
        f"row {row} of {len(ds):,} · {data['source']}:{data['source_row']} · turn {data['turn']} · "
        f"{data['seq_len']:,} tokens, {data['n_trained']:,} trained"
        + (" · truncated" if data["truncated"] else ""),
        highlight=False,
    )
    console.print(render_row(tok, data["input_ids"], data["loss_mask"]))


def vocab_command(
    dataset: Annotated[Path, typer.Argument(help="dataset folder written by `draftdeck tokenize`")],
    top: Annotated[int, typer.Option("--top", min=1, help="draft vocabulary size")],
    out: Annotated[Path, typer.Option("--out", help="output: .npz (d2t, t2d arrays) or .json")],
) -> None:
    """Draft vocabulary (EAGLE-3 d2t / t2d) of the K most frequent trained tokens."""
    from draftdeck.cli import _usage_exit
    from draftdeck.cli import out as console
    from draftdeck.shards.tools import draft_vocab, write_draft_vocab

    ds = _open_dataset(dataset)
    try:
        vocab = draft_vocab(ds.path, top)
        write_draft_vocab(vocab, out)
    except (InputError, UsageError) as exc:
        raise _usage_exit(str(exc)) from None
    console.print(
        f"wrote {out}: {len(vocab.ids):,} draft tokens of {len(vocab.t2d):,}, covering "
        f"{vocab.coverage:.2%} of trained tokens",
        highlight=False,
    )


def export_command(
    dataset: Annotated[Path, typer.Argument(help="dataset folder written by `draftdeck tokenize`")],
    format: Annotated[ExportFormat, typer.Option("--format", help="output format")],
    out: Annotated[Path, typer.Option("--out", help="output JSONL file (written atomically)")],
) -> None:
    """Export rows as JSONL with input_ids + loss_mask (speculators' prepare-data passes them through)."""
    from draftdeck.cli import out as console
    from draftdeck.shards.tools import export_speculators_jsonl

    ds = _open_dataset(dataset)
    n = export_speculators_jsonl(ds, out)
    console.print(f"wrote {out}: {n:,} rows", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the tokenization commands to `app`."""
    app.command("tokenize")(tokenize_command)
    app.command("inspect")(inspect_command)
    app.command("vocab")(vocab_command)
    app.command("export")(export_command)
