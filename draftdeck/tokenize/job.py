"""The `tokenize` kind: conversations in, Arrow shards with exact assistant loss masks out.

`run` tokenizes in this process (the CLI, tests). The service splits the same job into chunk tasks
(app/run/chunks.py) over :mod:`draftdeck.tokenize.chunks`, with the same parameters and options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from draftdeck.formats.detect import FormatName
from draftdeck.jobs.context import RunContext, file_roots
from draftdeck.jobs.params import (
    JobParams,
    alert_field,
    build_options,
    columns_field,
    from_format_field,
    inputs_field,
    loss_thresholds,
    max_rejected_field,
    preference_field,
    tags_field,
    tool_tags_field,
)
from draftdeck.quality import Output, Policy, Report
from draftdeck.shards.store import MANIFEST
from draftdeck.tokenize.options import TokenizeOptions

DATASET = "dataset"  # the default output folder, inside the job's folder


class TokenizeParams(JobParams):
    inputs: list[str] = inputs_field("chat data files (any shape `convert` reads)")
    tokenizer: str = Field(description="local folder of the target model's tokenizer")
    out: str | None = Field(
        default=None, description="new dataset folder: Arrow shards + manifest (default: in the job's folder)"
    )
    chat_template: str | None = Field(
        default=None, description="Jinja file replacing the tokenizer's template"
    )
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="template variables KEY=VALUE, e.g. enable_thinking=false",
        json_schema_extra={"cli_short": "-k"},
    )
    seq_length: int | None = Field(default=None, ge=2, le=1 << 24, description="maximum tokens per row")
    max_positions: int | None = Field(
        default=None, ge=2, le=1 << 24,
        description="most tokens the target reads: longer rows are rejected (default: the "
        "max_position_embeddings of the tokenizer folder's config.json, when it is the model's)",
    )  # fmt: skip
    truncation: Literal["right", "drop"] = Field(
        default="right", description="rows over seq_length: cut on the right, or drop"
    )
    on_missing: Literal["error", "drop"] = Field(
        default="error", description="rows without an assistant turn: fail the job, or drop"
    )
    shard_rows: int = Field(
        default=10_000, ge=1, le=10_000_000, description="output rows per Arrow shard (the last one fewer)"
    )
    verify_all: bool = Field(default=False, description="check every row of the fast encoder against HF")
    strict: bool = Field(default=False, description="every warning fails the job")
    max_rejected: float | None = max_rejected_field()
    alert_rejected: float | None = alert_field("rejected")
    alert_duplicated: float | None = alert_field("a duplicate")
    alert_truncated: float | None = alert_field("cut at seq_length")
    from_format: FormatName | None = from_format_field()
    columns: dict[str, str] = columns_field()
    tags: dict[str, str] = tags_field()
    tool_tags: Literal["parse", "keep"] = tool_tags_field()
    preference: Literal["chosen", "reject"] = preference_field()
    template_may_drop: list[Literal["content", "tool_calls", "reasoning", "tools", "system"]] = Field(
        default_factory=list,
        description="parts the chat template may drop on purpose: warned, not rejected (e.g. reasoning)",
    )
    encoder: Literal["auto", "hf", "tiktoken"] = Field(default="auto", description="token encoder")
    chunk_rows: int | None = Field(
        default=None, ge=1, le=10_000_000, description="conversations per chunk task (default: shard_rows)"
    )
    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "tokenizer", "chat_template")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)
    essentials: ClassVar[tuple[str, ...]] = ("seq_length", "template_kwargs", "chat_template")

    def policy(self) -> Policy:
        return Policy.build(None, self.strict, self.max_rejected, **loss_thresholds(self))

    def options(self, **extra: Any) -> TokenizeOptions:
        """The core's options; `workers` (processes in this process's pool) is the caller's: chunk
        tasks are the service's parallelism, so jobs do not take it."""
        opts: TokenizeOptions = build_options(TokenizeOptions, self, **extra)
        opts.check()
        return opts

    def out_dir(self, job_dir: Path) -> Path:
        return Path(self.out) if self.out else job_dir / DATASET


def dataset_output(out_dir: Path, report: Report) -> Output:
    """The dataset a successful run made, as an output of kind "dataset" (the service registers it)."""
    shards = [o for o in report.outputs if o.kind == "file"]
    from draftdeck.fileio import sha256_file

    return Output(
        str(out_dir),
        sum(o.rows for o in shards),
        sum(o.bytes for o in shards),
        sha256_file(out_dir / MANIFEST),
        kind="dataset",
    )


def tokenize_files(
    params: TokenizeParams, out_dir: Path, *, workers: int = 0, image_roots: tuple[str, ...] | None = None
) -> Report:
    from draftdeck.tokenize import pipeline

    opts = params.options(workers=workers, image_roots=image_roots)
    report = pipeline.tokenize_files([Path(p) for p in params.inputs], out_dir, opts)
    report.outputs.append(dataset_output(out_dir, report))
    return report


def run(params: TokenizeParams, ctx: RunContext) -> Report:
    from draftdeck.tokenize.chunks import check_out_dir

    out_dir = params.out_dir(ctx.out_dir)
    check_out_dir(out_dir)
    return tokenize_files(params, out_dir, workers=1, image_roots=file_roots(ctx))
