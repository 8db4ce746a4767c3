"""A mix's recipe: named sources, each with one amount (rows, a weight, or all), filters and a shape.

The YAML a user writes (``draftdeck mix RECIPE``), the New-job form's recipe field and the API's
JSON object are the same model, :class:`Recipe`::

    seed: 7
    total: 10000          # optional: the mix's rows
    to: openai            # optional: openai (default), sharegpt or parquet
    sources:
      - name: chat
        inputs: [chat.jsonl, more/]
        weight: 0.4       # this source makes up 40 % of the mix's rows
        max_turns: 12     # optional filters: min/max_turns, min/max_chars, has_tool_calls, has_reasoning
      - name: code
        inputs: [code.parquet]
        rows: 2000        # a quota: 2,000 rows drawn at random (more than it holds: repeated, with a warning)
        from: sharegpt    # optional: the one shape every row of this source must have
      - name: agent
        inputs: [traces/]
        all: true

:meth:`Recipe.from_yaml` reads the text with the line of every key, so that an unknown key, a
source with two amounts, weights summing over 1 or a missing input is an error naming its line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from draftdeck.errors import UsageError
from draftdeck.formats.columns import check_mapping
from draftdeck.formats.detect import FormatName

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
WEIGHT_SLACK = 1e-9  # weights written as decimals (0.1 + 0.2 + 0.7) may sum a hair over 1


class MixSource(BaseModel):
    """One source of a mix: its files and how many of its rows the mix takes."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(description="the source's name: every output row records it")
    inputs: list[str] = Field(min_length=1, description="files or folders, in any shape convert reads")
    rows: int | None = Field(default=None, ge=1, description="a quota: this many rows, drawn at random")
    weight: float | None = Field(default=None, gt=0, le=1, description="this share of the mix's rows")
    all: bool | None = Field(default=None, description="every row the source holds")
    from_format: FormatName | None = Field(default=None, alias="from", description="one shape for every row")
    columns: dict[str, str] = Field(
        default_factory=dict, description="how the source's fields make a conversation (as --columns)"
    )
    tags: dict[str, str] = Field(default_factory=dict, description="a messages column's keys (as --tags)")
    min_turns: int | None = Field(default=None, ge=1, description="messages other than system, at least")
    max_turns: int | None = Field(default=None, ge=1)
    min_chars: int | None = Field(
        default=None, ge=0, description="characters of text and reasoning, at least"
    )
    max_chars: int | None = Field(default=None, ge=0)
    has_tool_calls: bool | None = Field(
        default=None, description="true: only rows with tool calls; false: none"
    )
    has_reasoning: bool | None = Field(
        default=None, description="true: only rows with reasoning; false: none"
    )

    @model_validator(mode="after")
    def _one_amount(self) -> Self:
        if not NAME.match(self.name):
            raise ValueError(
                f"name {self.name!r}: letters, digits and _ . + - only, starting with a letter or digit"
            )
        try:  # a declared mapping that cannot read any row is refused with the recipe, naming the source
            check_mapping(self.columns, self.tags)
        except ValueError as exc:
            raise ValueError(f"source {self.name!r}: {exc}") from None
        given = [k for k in ("rows", "weight", "all") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"source {self.name!r} needs exactly one of rows, weight or all"
                + (f" (it has {' and '.join(given)})" if given else "")
            )
        if self.all is False:
            raise ValueError(
                f"source {self.name!r}: `all` can only be true (use rows or weight to take part)"
            )
        for low, high in (("min_turns", "max_turns"), ("min_chars", "max_chars")):
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"source {self.name!r}: {low} {lo} is above {high} {hi}")
        return self

    @property
    def amount(self) -> str:
        """The amount as written: "rows 2,000", "weight 0.4" or "all"."""
        if self.rows is not None:
            return f"rows {self.rows:,}"
        return f"weight {self.weight:g}" if self.weight is not None else "all"

    @property
    def filters(self) -> dict[str, Any]:
        names = ("min_turns", "max_turns", "min_chars", "max_chars", "has_tool_calls", "has_reasoning")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}


class Recipe(BaseModel):
    """Sources, a seed (the same seed gives the same bytes), an optional total and the output shape."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(description="the random draw's seed: the same recipe and seed give the same mix")
    total: int | None = Field(default=None, ge=1, description="the mix's rows (weights are shares of it)")
    to: Literal["openai", "sharegpt", "parquet"] = Field(default="openai", description="output shape")
    sources: list[MixSource] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [s.name for s in self.sources]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"source names must differ: {', '.join(twice)} appear twice")
        weights = sum(s.weight for s in self.sources if s.weight is not None)
        if weights > 1 + WEIGHT_SLACK:
            raise ValueError(f"the weights sum to {weights:g}, over 1")
        fixed = any(s.weight is None for s in self.sources)
        if weights and not fixed and self.total is None and abs(weights - 1) > WEIGHT_SLACK:
            raise ValueError(
                f"the weights sum to {weights:g} and no source has rows or all: give a total,"
                " or weights that sum to 1"
            )
        if fixed and weights and abs(weights - 1) <= WEIGHT_SLACK:
            raise ValueError("the weights sum to 1, which leaves no room for the sources with rows or all")
        return self

    # -- YAML ---------------------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, text: str, where: str = "recipe", base: Path | None = None) -> Recipe:
        """The recipe in `text` (YAML or JSON). `base`: the folder relative inputs are in (a recipe file's
        own folder); given, each input must exist. Raises UsageError naming `where` and the line."""
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            raise UsageError(f"{where}{line}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
        if not isinstance(data, dict) or node is None:
            raise UsageError(
                f"{where}: a recipe is a mapping with seed and sources (see `draftdeck mix --help`)"
            )
        lines = _key_lines(node)
        try:
            recipe = cls.model_validate(data)
        except ValidationError as exc:
            raise UsageError(_describe(exc, where, lines)) from None
        if base is not None:
            recipe = recipe.resolved(base, where, lines)
        return recipe

    def resolved(
        self, base: Path, where: str = "recipe", lines: dict[tuple[Any, ...], int] | None = None
    ) -> Recipe:
        """A copy whose relative inputs are relative to `base`; UsageError for one that is missing."""
        sources = []
        for i, s in enumerate(self.sources):
            found = []
            for j, p in enumerate(s.inputs):
                path = Path(p).expanduser()
                path = path if path.is_absolute() else base / path
                if not path.exists():
                    line = _line(lines or {}, ("sources", i, "inputs", j))
                    raise UsageError(f"{where}{line}: source {s.name!r}: {p}: no such file or directory")
                found.append(str(path))
            sources.append(s.model_copy(update={"inputs": found}))
        return self.model_copy(update={"sources": sources})

    def to_yaml(self) -> str:
        """The recipe as YAML (what "change and start again" puts back in the form)."""
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)


def _key_lines(node: yaml.Node, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    """The 1-based line of every key and list item under `node`, by its path (("sources", 2, "rows"))."""
    out: dict[tuple[Any, ...], int] = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = (*path, key.value)
            out.update(_key_lines(value, sub))
            out[sub] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out.update(_key_lines(item, (*path, i)))
    return out


def _line(lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> str:
    """ " line N" of the deepest known part of `loc` ("" when none is known)."""
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return f" line {lines[loc[:n]]}"
    return ""


_ALIASES = {"from_format": "from"}


def _describe(exc: ValidationError, where: str, lines: dict[tuple[Any, ...], int]) -> str:
    parts = []
    for e in exc.errors():
        loc = tuple(_ALIASES.get(str(x), x) if isinstance(x, str) else x for x in e["loc"])
        text = str(e["msg"]).removeprefix("Value error, ")
        named = ".".join(str(x) for x in loc)
        if not loc:  # the recipe as a whole (weights, names): its sources are what to look at
            loc = ("sources",)
        elif isinstance(loc[-1], int):  # a source's own check names the source
            named = ""
        if e["type"] == "extra_forbidden":
            text = f"unknown key {loc[-1]!r}"
        elif e["type"] == "missing":
            text = f"{named} is required"
        elif named:
            text = f"{named}: {text}"
        parts.append(f"{where}{_line(lines, loc)}: {text}")
    return "; ".join(parts[:5])
