"""`draftdeck mix RECIPE --out FILE`: a recipe of named sources into one converted file, in-process.

    draftdeck mix RECIPE --out FILE [--report FILE] [--workers N] [--strict] [--max-rejected F] ...

Relative inputs in RECIPE are relative to its folder. Exit codes: 0 success, 1 the policy failed the
mix (an empty mix always does), 2 usage errors (the recipe's line is named).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from draftdeck.cli.common import out, run_in_process, usage_exit
from draftdeck.cli.data import REPORT, WORKERS, default_workers
from draftdeck.cli.options import model_parameters, params_from
from draftdeck.errors import UsageError
from draftdeck.mix import Recipe
from draftdeck.mix.composition import composition
from draftdeck.mix.job import MixParams, mix_files
from draftdeck.quality import Report
from draftdeck.units import binary_size, count

RECIPE = inspect.Parameter(
    "recipe", inspect.Parameter.KEYWORD_ONLY,
    annotation=Annotated[Path, typer.Argument(help="the recipe, a YAML file", metavar="RECIPE")],
)  # fmt: skip


def print_composition(result: Report) -> None:
    """The composition table: per source rows in, rejected, duplicates, not drawn, repeats, rows
    written and their share of the mix (the report and the job page also have means per row)."""
    mix = result.extra.get("mix")
    if not isinstance(mix, dict):
        return
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for i, name in enumerate(("source", "in", "rejected", "dups", "not drawn", "repeats", "out", "share")):
        table.add_column(name, justify="left" if i == 0 else "right", overflow="fold")
    for r in composition(mix):
        table.add_row(
            escape(r["name"]), f"{r['rows_in']:,}", f"{r['rejected_rows']:,}", f"{r['duplicates']:,}",
            f"{r['not_sampled']:,}", f"{r['repeated']:,}", f"{r['rows_out']:,}", f"{r['share']:.1%}",
            style="bold" if r["name"] == "total" else None,
        )  # fmt: skip
    out.print(f"[bold]composition[/] (seed {mix['seed']})", highlight=False)
    out.print(table)
    for r in mix["sources"]:
        for kept, n in r["duplicates_against"].items():
            out.print(f"  {escape(r['name'])}: {n:,} duplicates of rows kept from {escape(kept)}",
                      highlight=False)  # fmt: skip


def mix_command(*, recipe: Path, report: Path | None, workers: int | None, **values: Any) -> None:
    try:
        text = recipe.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise usage_exit(f"{recipe}: cannot read the recipe ({exc})") from None
    try:
        parsed = Recipe.from_yaml(text, str(recipe), base=recipe.resolve().parent)
        params = params_from(MixParams, {**values, "recipe": parsed}).absolute()
        assert isinstance(params, MixParams)
        params.check([])
        params.build_policy()  # a bad policy file: a usage error now
    except UsageError as exc:
        raise usage_exit(str(exc)) from None
    assert params.out is not None  # required on the command line
    out_path = Path(params.out)
    n = len(params.recipe.sources)
    result = run_in_process(
        f"mix {recipe} -> {params.recipe.to} {out_path}",
        f"mix {count(n, 'source')}",
        lambda progress: mix_files(params, out_path, progress=progress, workers=workers or default_workers()),
        report,
        details=print_composition,
    )
    print_composition(result)
    for o in result.outputs:
        out.print(f"wrote {o.path}: {count(o.rows, 'rows')}, {binary_size(o.bytes)}, sha256 {o.sha256[:16]}",
                  highlight=False, soft_wrap=True)  # fmt: skip


def register(app: typer.Typer) -> None:
    fields = model_parameters(MixParams, required=("out",), exclude=("recipe",))
    mix_command.__signature__ = inspect.Signature([RECIPE, *fields, REPORT, WORKERS])  # type: ignore[attr-defined]
    mix_command.__doc__ = (
        "Mix named sources (each a quota, a weight or all of it) into one converted file:"
        " duplicates removed across sources, every row counted per source."
    )
    app.command("mix")(mix_command)
