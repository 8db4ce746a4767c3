"""The `mix` kind: a recipe of named sources (quotas, weights or all) into one converted file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, field_validator

from draftdeck.convert import ConvertOptions
from draftdeck.errors import UsageError
from draftdeck.jobs.context import RunContext, file_roots
from draftdeck.jobs.params import (
    JobParams,
    alert_field,
    build_options,
    build_policy,
    max_rejected_field,
    max_row_bytes_field,
    out_file_field,
    policy_file_field,
    policy_or_default,
    preference_field,
    strict_field,
    tool_tags_field,
    tree_paths_field,
)
from draftdeck.mix import Recipe, check_recipe_out, mix
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Policy, Report


class MixParams(JobParams):
    recipe: Recipe = Field(
        description="the recipe (YAML): seed, optional total and to, and sources, each a name, inputs"
        " and one of rows, weight or all, with optional filters and from",
        json_schema_extra={"widget": "yaml"},
    )
    out: str | None = out_file_field()
    strict: bool = strict_field()
    max_rejected: float | None = max_rejected_field()
    alert_rejected: float | None = alert_field("rejected")
    alert_duplicated: float | None = alert_field("a duplicate")
    policy_file: str | None = policy_file_field()
    tree_paths: Literal["all", "best"] = tree_paths_field()
    tool_tags: Literal["parse", "keep"] = tool_tags_field()
    preference: Literal["chosen", "reject"] = preference_field()
    placeholders: Literal["reject", "strip", "keep"] = Field(
        default="reject", description="rows whose answer is a placeholder: reject, strip the answers or keep"
    )
    max_row_bytes: int = max_row_bytes_field()
    input_paths: ClassVar[tuple[str, ...]] = ("policy_file",)
    output_paths: ClassVar[tuple[str, ...]] = ("out",)

    @field_validator("recipe", mode="before")
    @classmethod
    def _yaml(cls, value: Any) -> Any:
        """The form and ``-p recipe=...`` give YAML text; the API a JSON object (or the same text)."""
        if isinstance(value, str):
            try:
                return Recipe.from_yaml(value)
            except UsageError as exc:
                raise ValueError(str(exc)) from None
        return value

    def _map_paths(self, resolve: Callable[[str, bool], Path]) -> Self:
        """The recipe's inputs are input paths too: the server confines them to its data roots."""
        mapped = super()._map_paths(resolve)
        sources = [
            s.model_copy(update={"inputs": [str(resolve(p, True)) for p in s.inputs]})
            for s in mapped.recipe.sources
        ]
        return mapped.model_copy(update={"recipe": mapped.recipe.model_copy(update={"sources": sources})})

    def check(self, roots: list[Path]) -> None:
        if self.out is not None:
            check_recipe_out(self.recipe, Path(self.out))

    def build_policy(self) -> Policy:
        return build_policy(self)

    def policy(self) -> Policy:
        return policy_or_default(self)

    def options(self, workers: int = 1, image_roots: tuple[str, ...] | None = None) -> ConvertOptions:
        opts: ConvertOptions = build_options(ConvertOptions, self, workers=workers, image_roots=image_roots)
        return opts

    def out_path(self, out_dir: Path) -> Path:
        suffix = ".parquet" if self.recipe.to == "parquet" else ".jsonl"
        return Path(self.out) if self.out else out_dir / f"mix-{self.recipe.to}{suffix}"


def mix_files(
    params: MixParams,
    out: Path,
    *,
    progress: Progress = no_progress,
    workers: int = 1,
    image_roots: tuple[str, ...] | None = None,
) -> Report:
    return mix(params.recipe, out, params.build_policy(), params.options(workers, image_roots), progress)


def run(params: MixParams, ctx: RunContext) -> Report:
    return mix_files(params, params.out_path(ctx.out_dir), progress=ctx.progress, image_roots=file_roots(ctx))
