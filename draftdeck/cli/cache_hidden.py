"""`draftdeck cache-hidden`: the target's hidden states of a tokenized dataset, stored once as a cache
that `draftdeck train --hidden-states CACHE` reads without the target's decoder layers.

    draftdeck cache-hidden DATASET --target DIR --out DIR [--drafter KIND ...] [--dtype bf16|fp16|fp32]
        [--compress zstd[:LEVEL]] [--format draftdeck|speculators]
    draftdeck cache-hidden DATASET --target DIR --import FOLDER --stored-layers I,J,... --out DIR
        (FOLDER: speculators'/vLLM's hs_<i>.safetensors or SpecForge's rows_*/data_<i>.ckpt[.gz])

Options are the `cache-hidden` job kind's parameters (draftdeck/drafter/train/cache/params.py). The disk it
takes is said before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from draftdeck.cli.common import out, usage_exit
from draftdeck.cli.data import REPORT
from draftdeck.cli.drafter import ConsoleContext, _run
from draftdeck.cli.options import job_command
from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.errors import DraftDeckError


def cache_hidden(params: CacheParams, *, report: Path | None) -> None:
    from draftdeck.drafter.train.cache.build import project
    from draftdeck.drafter.train.cache.job import run_cache_hidden
    from draftdeck.drafter.train.launched import Launched
    from draftdeck.jobs.context import LocalContext

    where = Launched.from_env()
    if where is not None and where.rank != 0:  # one of a launcher's ranks: rank 0 speaks for the build
        run_cache_hidden(params, LocalContext(Path(params.out).parent))
        return
    if params.import_from is None:
        try:
            out.print(escape(project(params).said()), highlight=False, soft_wrap=True)
        except DraftDeckError as exc:
            raise usage_exit(str(exc)) from None
    ctx = ConsoleContext(Path(params.out))
    result = _run(run_cache_hidden, params, f"cache-hidden -> {params.out}", report, ctx)
    x = result.extra
    out.print(
        f"{x['tokens']:,} tokens, {x['bytes']:,} bytes ({x['bytes_per_token']:,} per token, {x['dtype']}"
        f"{', ' + x['compression'] if x.get('compression') else ''}),"
        f" hidden_states {x['layers']}; {x['cache/rows_per_s']:,.1f} rows/s, {x['cache/tokens_per_s']:,.0f}"
        f" tokens/s, {x['cache/mb_per_s']:,.1f} MB/s",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("cache-hidden")(
        job_command(CacheParams, cache_hidden, extra=[REPORT],
                    doc="Run the target once over a tokenized dataset and store the hidden states the"
                    " drafter kinds read (and the final one), checked, for train --hidden-states; or take"
                    " in speculators' hs_<i>.safetensors or SpecForge's records (--import, --stored-layers).")
    )  # fmt: skip
