"""The `convert` kind: chat data of any known shape (detected per row) to OpenAI, ShareGPT or Parquet."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from draftdeck.convert import ConvertOptions, check_out, convert
from draftdeck.formats.detect import FormatName
from draftdeck.jobs.context import RunContext, file_roots
from draftdeck.jobs.params import (
    JobParams,
    alert_field,
    build_options,
    build_policy,
    columns_field,
    from_format_field,
    images_field,
    inputs_field,
    max_image_bytes_field,
    max_image_pixels_field,
    max_rejected_field,
    max_row_bytes_field,
    out_file_field,
    policy_file_field,
    policy_or_default,
    preference_field,
    strict_field,
    tags_field,
    tool_tags_field,
    tree_paths_field,
)
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Policy, Report


class ConvertParams(JobParams):
    inputs: list[str] = inputs_field(
        "data files (JSONL, JSON, gzip/zstd, Parquet, Arrow), datasets save_to_disk folders,"
        " or folders of such files"
    )
    to: Literal["openai", "sharegpt", "parquet"] = Field(
        default="sharegpt", title="Output format", description="output format"
    )
    out: str | None = out_file_field()
    strict: bool = strict_field()
    max_rejected: float | None = max_rejected_field()
    alert_rejected: float | None = alert_field("rejected")
    alert_duplicated: float | None = alert_field("a duplicate")
    policy_file: str | None = policy_file_field()
    tree_paths: Literal["all", "best"] = tree_paths_field()
    from_format: FormatName | None = from_format_field()
    columns: dict[str, str] = columns_field()
    tags: dict[str, str] = tags_field()
    tool_tags: Literal["parse", "keep"] = tool_tags_field()
    preference: Literal["chosen", "reject"] = preference_field()
    allow_prompt_only: bool = Field(
        default=False, description="keep rows without an assistant turn (to regenerate answers)"
    )
    placeholders: Literal["reject", "strip", "keep"] = Field(
        default="reject",
        description="rows whose answer is a placeholder: reject, strip the answers (a prompt-only row"
        " to regenerate) or keep",
    )
    placeholder_min_rows: int = Field(
        default=32, ge=2, le=1 << 40,
        description="a short answer is a placeholder on at least this many different prompts ...",
    )  # fmt: skip
    placeholder_min_share: float = Field(
        default=0.2, ge=0, le=1, description="... that are also this share of the rows"
    )
    placeholder_filler_rows: int = Field(
        default=3, ge=1, le=1 << 40,
        description="a known filler answer (ok, n/a, todo, placeholder, an ellipsis, empty) is a placeholder"
        " on this many different prompts",
    )  # fmt: skip
    max_row_bytes: int = max_row_bytes_field()
    images: Literal["keep", "reject"] = images_field()
    max_image_bytes: int = max_image_bytes_field()
    max_image_pixels: int = max_image_pixels_field()
    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "policy_file")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)
    essentials: ClassVar[tuple[str, ...]] = ("to", "allow_prompt_only", "placeholders")

    def build_policy(self) -> Policy:
        """The policy (raises PolicyError for a bad policy file)."""
        return build_policy(self)

    def policy(self) -> Policy:
        return policy_or_default(self)

    def check(self, roots: list[Path]) -> None:
        if self.out is not None:
            check_out([Path(p) for p in self.inputs], Path(self.out), roots)

    def options(self, **extra: object) -> ConvertOptions:
        opts: ConvertOptions = build_options(ConvertOptions, self, policy=self.build_policy(), **extra)
        return opts

    def out_path(self, out_dir: Path) -> Path:
        suffix = ".parquet" if self.to == "parquet" else ".jsonl"
        return Path(self.out) if self.out else out_dir / f"converted-{self.to}{suffix}"


def convert_files(
    params: ConvertParams,
    out: Path,
    *,
    progress: Progress = no_progress,
    workers: int = 1,
    image_roots: tuple[str, ...] | None = None,
) -> Report:
    return convert(
        [Path(p) for p in params.inputs], out, params.to,
        options=params.options(workers=workers, image_roots=image_roots), progress=progress,
    )  # fmt: skip


def run(params: ConvertParams, ctx: RunContext) -> Report:
    return convert_files(
        params, params.out_path(ctx.out_dir), progress=ctx.progress, image_roots=file_roots(ctx)
    )
