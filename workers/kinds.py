"""Job kinds: for each, its queue, its parameters and the core function it runs.

This is the routing table: a kind's queue decides which workers may take it (`gpu` for training,
evaluation and local generation; `cpu` for everything else).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES
from draftdeck.paths import resolve_in_roots
from draftdeck.quality import Policy, Report
from workers.context import JobContext


class JobParams(BaseModel):
    """Base of every kind's parameters: unknown keys are refused, paths are confined to the roots."""

    model_config = ConfigDict(extra="forbid")
    input_paths: ClassVar[tuple[str, ...]] = ()  # must exist inside the roots
    output_paths: ClassVar[tuple[str, ...]] = ()  # may not exist yet, but must land inside the roots

    def confined(self, roots: list[Path]) -> JobParams:
        """Return a copy whose paths are resolved inside `roots` (raises PathNotAllowedError).

        A path field holds one path, a list of paths, or None (an optional path left unset)."""
        updates: dict[str, Any] = {}
        for names, must_exist in ((self.input_paths, True), (self.output_paths, False)):
            for name in names:
                value = getattr(self, name)
                if isinstance(value, list):
                    updates[name] = [str(resolve_in_roots(v, roots, must_exist=must_exist)) for v in value]
                elif value is not None:
                    updates[name] = str(resolve_in_roots(value, roots, must_exist=must_exist))
        return self.model_copy(update=updates)

    def policy(self) -> Policy:
        return Policy()


def one_or_many(cls: type, value: Any) -> Any:
    """A list field given one string (`jobs submit -p paths=FILE`, a form field) holds that one path."""
    return [value] if isinstance(value, str) else value


class ScanParams(JobParams):
    path: str = Field(description="data file to scan (JSONL, JSON array or object; gzip/zstd too)")
    max_row_bytes: int = Field(
        default=DEFAULT_MAX_ROW_BYTES, gt=0, description="rows above this size are rejected"
    )
    input_paths: ClassVar[tuple[str, ...]] = ("path",)


def run_scan(params: ScanParams, ctx: JobContext) -> Report:
    from draftdeck.scan import scan_file

    report = scan_file(Path(params.path), progress=ctx.progress, max_row_bytes=params.max_row_bytes)
    report.outputs.append(ctx.write_json_output("scan-report.json", report.to_dict(), rows=report.rows_out))
    return report


class ConvertParams(JobParams):
    """The parameters of `draftdeck convert`: the same names as its options."""

    paths: list[str] = Field(min_length=1, description="data files or save_to_disk folders to convert")
    to: Literal["openai", "sharegpt", "parquet"] = Field(default="sharegpt", description="output format")
    out: str | None = Field(default=None, description="output file in the data roots (default: job folder)")
    strict: bool = Field(default=False, description="every warning fails the job")
    max_rejected: float | None = Field(default=None, ge=0, le=1, description="fail above this rejected share")
    policy_file: str | None = Field(default=None, description="JSON policy: {strict, max_rejected, codes}")
    tree_paths: Literal["all", "best"] = Field(default="all", description="trees: every leaf or best path")
    allow_prompt_only: bool = Field(default=False, description="keep rows without an assistant turn")
    max_row_bytes: int = Field(default=DEFAULT_MAX_ROW_BYTES, gt=0, description="larger rows are rejected")
    input_paths: ClassVar[tuple[str, ...]] = ("paths", "policy_file")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)

    one_path_is_a_list = field_validator("paths", mode="before")(one_or_many)

    def _policy(self) -> Policy:
        policy_file = Path(self.policy_file) if self.policy_file else None
        return Policy.build(policy_file, self.strict, self.max_rejected)

    def policy(self) -> Policy:
        from draftdeck.errors import PolicyError

        try:
            return self._policy()
        except PolicyError:  # run_convert raises it again, failing the job with the reason
            return Policy(strict=self.strict, max_rejected=self.max_rejected)


def run_convert(params: ConvertParams, ctx: JobContext) -> Report:
    from draftdeck.convert import ConvertOptions, convert

    options = ConvertOptions(
        policy=params._policy(),
        allow_prompt_only=params.allow_prompt_only,
        tree_paths=params.tree_paths,
        max_row_bytes=params.max_row_bytes,
    )
    suffix = ".parquet" if params.to == "parquet" else ".jsonl"
    out = Path(params.out) if params.out else ctx.out_dir / f"converted-{params.to}{suffix}"
    return convert([Path(p) for p in params.paths], out, params.to, options=options, progress=ctx.progress)


class TokenizeParams(JobParams):
    """The parameters of `draftdeck tokenize`: the same names as its options."""

    inputs: list[str] = Field(min_length=1, description="chat data files (any shape `convert` reads)")
    tokenizer: str = Field(description="local folder of the target model's tokenizer")
    out: str | None = Field(default=None, description="new dataset folder (default: in the job folder)")
    chat_template: str | None = Field(default=None, description="Jinja file to use as template")
    template_kwargs: dict[str, Any] = Field(default_factory=dict, description="e.g. enable_thinking")
    seq_length: int | None = Field(default=None, ge=2, description="maximum tokens per row")
    truncation: Literal["right", "drop"] = Field(default="right", description="rows too long: cut or drop")
    on_missing: Literal["error", "drop"] = Field(default="error", description="prompt-only rows")
    shard_rows: int = Field(default=10_000, ge=1, description="rows per Arrow shard")
    verify_all: bool = Field(default=False, description="check every fast-encoder row against HF")
    strict: bool = Field(default=False, description="every warning fails the job")
    encoder: Literal["auto", "hf", "tiktoken"] = Field(default="auto", description="token encoder")
    workers: int = Field(default=0, ge=0, description="processes (0: one per core)")
    chunk_rows: int | None = Field(
        default=None, ge=1, description="conversations per chunk task (default: shard_rows)"
    )
    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "tokenizer", "chat_template")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)

    one_path_is_a_list = field_validator("inputs", mode="before")(one_or_many)

    def policy(self) -> Policy:
        return Policy(strict=self.strict)


def tokenize_options(params: TokenizeParams) -> Any:
    from draftdeck.tokenize.pipeline import TokenizeOptions

    return TokenizeOptions(
        tokenizer=Path(params.tokenizer),
        chat_template=Path(params.chat_template) if params.chat_template else None,
        template_kwargs=params.template_kwargs,
        seq_length=params.seq_length,
        truncation=params.truncation,
        on_missing=params.on_missing,
        shard_rows=params.shard_rows,
        verify_all=params.verify_all,
        strict=params.strict,
        encoder=params.encoder,
        workers=params.workers,
    )


def tokenize_out(params: TokenizeParams, ctx: JobContext) -> Path:
    return Path(params.out) if params.out else ctx.out_dir / "dataset"


def run_tokenize(params: TokenizeParams, ctx: JobContext) -> Report:
    """Splits the input into chunk tasks (workers/chunks.py): always, so that one path runs every job."""
    from workers.chunks import plan_tokenize

    return plan_tokenize(params, ctx)


@dataclass(frozen=True)
class JobKind:
    name: str
    queue: str
    params: type[JobParams]
    run: Callable[[Any, JobContext], Report]
    summary: str


KINDS: dict[str, JobKind] = {
    k.name: k
    for k in (
        JobKind(
            "scan",
            "cpu",
            ScanParams,
            run_scan,
            "Pre-flight: rows, bytes, parse errors and key sets of one file",
        ),
        JobKind(
            "convert",
            "cpu",
            ConvertParams,
            run_convert,
            "Convert chat data (shapes detected per row) to OpenAI, ShareGPT or Parquet",
        ),
        JobKind(
            "tokenize",
            "cpu",
            TokenizeParams,
            run_tokenize,
            "Tokenize with the target's chat template into Arrow shards with exact loss masks",
        ),
    )
}


def get_kind(name: str) -> JobKind:
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown job kind {name!r}; known kinds: {', '.join(sorted(KINDS))}") from None
