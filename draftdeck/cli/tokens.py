"""`draftdeck tokenize` (options derived from the kind's parameter model), `inspect`, `vocab`, `export`,
`cache`.

    draftdeck tokenize INPUT... --tokenizer DIR --out DIR [--chat-template FILE] [-k enable_thinking=false]
        [--seq-length N] [--truncation right|drop] [--on-missing error|drop] [--shard-rows N]
        [--report FILE] [--verify-all] [--strict] [--encoder auto|hf|tiktoken] [--workers N]
    draftdeck inspect DATASET --row N [--tokenizer DIR]
    draftdeck vocab DATASET --top K --out FILE(.npz|.json)
    draftdeck export DATASET --format speculators-jsonl --out FILE
    draftdeck cache [--clear]

Exit codes: 0 success, 1 the job ran but failed its policy, 2 usage errors.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from draftdeck.cli.common import out as console
from draftdeck.cli.common import run_in_process, usage_exit
from draftdeck.cli.data import REPORT
from draftdeck.cli.options import job_command, option
from draftdeck.errors import InputError, UsageError
from draftdeck.paths import resolve_user_path
from draftdeck.tokenize.job import TokenizeParams, tokenize_files
from draftdeck.units import binary_size, count


class ExportFormat(StrEnum):
    speculators_jsonl = "speculators-jsonl"


WORKERS = option("workers", int, 0, min=0, help="processes (0: one per core)")


def tokenize(params: TokenizeParams, *, report: Path | None, workers: int) -> None:
    assert params.out is not None  # required on the command line
    out_dir = Path(params.out)
    try:
        params.options(workers=workers)
    except UsageError as exc:
        raise usage_exit(str(exc)) from None
    n = len(params.inputs)
    result = run_in_process(
        f"tokenize -> {out_dir}",
        f"tokenize {count(n, 'input')}",
        lambda progress: tokenize_files(params, out_dir, workers=workers),
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
    if result.counts.get("images"):  # a vision-language target's rows with images
        console.print(
            f"images: {result.counts['images']:,} in the rows, {result.counts['image_tokens']:,} image tokens"
            f" (loss mask 0), stored once each under {out_dir / 'images'}",
            highlight=False,
            soft_wrap=True,
        )
    for o in result.outputs:
        console.print(
            f"wrote {o.path}: {count(o.rows, 'rows')}, {binary_size(o.bytes)}, sha256 {o.sha256[:16]}",
            highlight=False,
            soft_wrap=True,
        )
    for o in result.outputs:
        if o.kind == "dataset":  # how to browse it: the dashboard finds it, or is told where it is
            console.print(
                f"browse it: the dashboard's Datasets page offers {o.path} to register when it lies under"
                " a data root (./data, the home); elsewhere, register it there by path",
                highlight=False,
                soft_wrap=True,
            )


def _open_dataset(dataset: Path) -> Any:
    from draftdeck.shards.store import ShardDataset

    try:
        return ShardDataset(dataset)
    except InputError as exc:
        raise usage_exit(str(exc)) from None


def _manifest_tokenizer(ds: Any) -> Path:
    """The dataset's tokenizer on this machine (draftdeck/shards/tokenizer_lookup.py), searched for
    by fingerprint in the data roots the server would use; UsageError saying what was tried."""
    import os

    from draftdeck.shards.tokenizer_lookup import find_tokenizer

    text = os.environ.get("DRAFTDECK_DATA_ROOTS", "")
    roots = [Path(p) for p in text.replace(",", ":").split(":") if p.strip()] or [Path.cwd() / "data"]
    found = find_tokenizer(ds.manifest, ds.path, roots)
    if found is None:
        ref = ds.manifest.tokenizer
        named = f"{ref.path!r} (fingerprint {ref.fingerprint[:12]})" if ref else "none"
        raise UsageError(
            f"{ds.path}: the manifest's tokenizer {named} is not on this machine, by path nor by"
            f" fingerprint under {', '.join(map(str, roots))}; pass --tokenizer DIR"
        )
    return found


def inspect_command(
    dataset: Annotated[Path, typer.Argument(help="dataset folder written by `draftdeck tokenize`")],
    row: Annotated[int, typer.Option("--row", min=0, help="row number (0-based)")] = 0,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="tokenizer folder (default: the manifest's, by its path or by its fingerprint under"
            " $DRAFTDECK_DATA_ROOTS, else ./data)",
        ),
    ] = None,
) -> None:
    """Print one row's tokens: trained tokens in green, context dimmed; whitespace and specials visible."""
    from draftdeck.chat.render import load_tokenizer
    from draftdeck.cli.inspect import render_row

    ds = _open_dataset(dataset)
    try:
        data = ds.row(row)
        tok = load_tokenizer(tokenizer or _manifest_tokenizer(ds))
    except (IndexError, InputError, UsageError) as exc:
        raise usage_exit(str(exc)) from None
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
    from draftdeck.shards.tools import draft_vocab, write_draft_vocab

    ds = _open_dataset(dataset)
    try:
        vocab = draft_vocab(ds.path, top)
        write_draft_vocab(vocab, out)
    except (InputError, UsageError) as exc:
        raise usage_exit(str(exc)) from None
    console.print(
        f"wrote {resolve_user_path(out)}: {len(vocab.ids):,} draft tokens of {len(vocab.t2d):,}, covering "
        f"{vocab.coverage:.2%} of trained tokens",
        highlight=False,
        soft_wrap=True,
    )


def export_command(
    dataset: Annotated[Path, typer.Argument(help="dataset folder written by `draftdeck tokenize`")],
    format: Annotated[ExportFormat, typer.Option("--format", help="output format")],
    out: Annotated[Path, typer.Option("--out", help="output JSONL file (written atomically)")],
) -> None:
    """Export rows as JSONL with input_ids + loss_mask (speculators' prepare-data passes them through)."""
    from draftdeck.shards.tools import export_speculators_jsonl

    ds = _open_dataset(dataset)
    n = export_speculators_jsonl(ds, out)
    console.print(f"wrote {resolve_user_path(out)}: {count(n, 'rows')}", highlight=False, soft_wrap=True)


def cache_command(
    clear: Annotated[bool, typer.Option("--clear", help="remove every saved tables file")] = False,
) -> None:
    """Show the tokenizer cache (checked tiktoken tables saved between processes), or clear it."""
    from draftdeck.tokenize.loaded import MAX_TABLES_FILES, tables_folder

    folder = tables_folder()
    files = (
        sorted(folder.glob("*.npz"), key=lambda f: f.stat().st_mtime, reverse=True) if folder.is_dir() else []
    )
    total = sum(f.stat().st_size for f in files)
    if clear:
        for f in files:
            f.unlink(missing_ok=True)
        console.print(f"removed {count(len(files), 'tables file')} ({binary_size(total)}) from {folder}",
                      highlight=False, soft_wrap=True)  # fmt: skip
        return
    console.print(
        f"{folder}: {count(len(files), 'tables file')}, {binary_size(total)}", highlight=False, soft_wrap=True
    )
    for f in files:
        used = datetime.fromtimestamp(f.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
        console.print(f"  {f.name}  {binary_size(f.stat().st_size):>10}  last used {used}", highlight=False)
    console.print(
        f"The {MAX_TABLES_FILES} most recently used are kept; a removed one is rebuilt when needed"
        " (DRAFTDECK_CACHE moves the folder).",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Add the tokenization commands to `app`."""
    app.command("tokenize")(
        job_command(TokenizeParams, tokenize, required=("out",), exclude=("chunk_rows",),
                    extra=[REPORT, WORKERS],
                    doc="Tokenize conversations with the target's chat template into Arrow shards with exact"
                    " loss masks.")
    )  # fmt: skip
    app.command("inspect")(inspect_command)
    app.command("vocab")(vocab_command)
    app.command("export")(export_command)
    app.command("cache")(cache_command)
