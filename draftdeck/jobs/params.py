"""The base of every job kind's parameters, and the bounds they share.

A kind's parameters are one pydantic model. From it come the core's options (:func:`build_options`),
the JSON API schema (``model_json_schema``), the new-job form's fields and the CLI's options
(:mod:`draftdeck.cli.options`). Which fields are input paths and which are output paths is declared
once, on the model: the server confines both to its data roots, the CLI takes them as they are.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from draftdeck.errors import PathNotAllowedError, PolicyError
from draftdeck.formats.columns import check_columns, check_tags
from draftdeck.formats.images import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS
from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES
from draftdeck.paths import check_path_text, resolve_in_roots, resolve_user_path
from draftdeck.quality import LOSSES, Policy

MAX_INPUTS = 10_000
MAX_ROW_BYTES_LIMIT = 1 << 30  # 1 GiB: a larger row is a bug upstream, and would not fit a reader's buffer


def inputs_field(description: str) -> Any:
    """The `inputs` field every kind has: one or more paths (one string is a list of one)."""
    return Field(min_length=1, max_length=MAX_INPUTS, description=description)


def from_format_field() -> Any:
    """`from_format` (CLI `--from`): one input shape every row must have, for the kinds reading chat rows.
    Its type is :data:`draftdeck.formats.detect.FormatName`, so an unknown name is refused listing
    the known ones."""
    return Field(
        default=None,
        description="read every row as this shape (default: detect per row); a row of another shape"
        " is rejected as format_mismatch",
        json_schema_extra={"cli_flag": "--from"},
    )


def tool_tags_field() -> Any:
    """`tool_tags`: what Hermes-style tool calls written as text become (the kinds reading chat rows)."""
    return Field(
        default="parse",
        description="Hermes <tool_call> / <tool_response> text: parse into tool calls and tool messages,"
        " or keep as text",
    )


def preference_field() -> Any:
    """`preference`: what a preference row (chosen and rejected sides) becomes."""
    return Field(
        default="chosen",
        description="preference rows (chosen/rejected): read the chosen conversation, or reject them"
        " as preference_row",
    )


def columns_field() -> Any:
    return Field(
        default_factory=dict,
        description="declare how a row's fields make a conversation, for shapes no reader guesses"
        " (KEY=FIELD; keys: prompt, query, response, reasoning, system, history, tools, messages)",
    )


def tags_field() -> Any:
    return Field(
        default_factory=dict,
        description="the keys of a `messages` column's turns (KEY=VALUE; keys: role_tag, content_tag,"
        " user_tag, assistant_tag, system_tag, observation_tag, function_tag)",
    )


def images_field() -> Any:
    """`images`: what a row's images become (the kinds reading chat rows into an output that holds them)."""
    return Field(
        default="keep",
        description="rows with images: keep them (each checked, stored once in images/ beside the output)"
        " or reject them as multimodal_content (data for a text-only target)",
    )


def max_image_bytes_field() -> Any:
    return Field(
        default=DEFAULT_MAX_IMAGE_BYTES, gt=0, le=1 << 30,
        description="an image file above this size is rejected as image_too_large (default 20 MiB)",
    )  # fmt: skip


def max_image_pixels_field() -> Any:
    return Field(
        default=DEFAULT_MAX_IMAGE_PIXELS, gt=0, le=1 << 32,
        description="an image of more pixels (width x height) is rejected as image_too_large"
        " (default 8192 x 8192)",
    )  # fmt: skip


def max_row_bytes_field() -> Any:
    return Field(
        default=DEFAULT_MAX_ROW_BYTES,
        gt=0,
        le=MAX_ROW_BYTES_LIMIT,
        description="rows above this size are rejected as oversize_row (at most 1 GiB)",
    )


def out_file_field() -> Any:
    return Field(
        default=None,
        title="Output file",
        description="output file, written atomically (default: in the job's folder)",
    )


def strict_field() -> Any:
    return Field(default=False, description="every warning fails the job")


def policy_file_field() -> Any:
    return Field(default=None, description="JSON policy file: {strict, max_rejected, codes}")


def tree_paths_field() -> Any:
    return Field(default="all", description="message trees: every leaf or the best-ranked path")


def max_rejected_field() -> Any:
    return Field(
        default=0.5, ge=0, le=1,
        description="fail the job when more than this share of the rows is rejected (1: never)",
    )  # fmt: skip


def alert_field(what: str) -> Any:
    return Field(
        default=0.05, ge=0, le=1,
        description=f"raise an alert (the job still succeeds) when more than this share of rows is {what}",
    )  # fmt: skip


def loss_thresholds(params: BaseModel) -> dict[str, float | None]:
    """The alert thresholds a kind's parameters hold (alert_rejected, ...), for Policy.build."""
    return {name: getattr(params, name) for name in LOSSES if name in type(params).model_fields}


def build_policy(params: Any) -> Policy:
    """The policy of a kind with `strict`, `max_rejected`, `policy_file` and the alert shares (raises
    PolicyError for a bad policy file)."""
    file = Path(params.policy_file) if params.policy_file else None
    return Policy.build(file, params.strict, params.max_rejected, **loss_thresholds(params))


def policy_or_default(params: Any) -> Policy:
    """:func:`build_policy`, or the policy without its file when the file is bad (the run raises the
    file's error again, failing the job with the reason)."""
    try:
        return build_policy(params)
    except PolicyError:
        return Policy.build(None, params.strict, params.max_rejected, **loss_thresholds(params))


def closest_field(model: type[BaseModel], name: str) -> str | None:
    """The known field a misspelt parameter ("maxrejected", "max-rejected") most likely meant."""
    known = list(model.model_fields)
    for guess in (name, name.replace("-", "_").lower()):
        close = difflib.get_close_matches(guess, known, n=1, cutoff=0.6)
        if close:
            return close[0]
    return None


def _message(error: Any) -> str:
    """One pydantic error in a user's words: a choice names the choices and the closest one, and a
    validator's message loses pydantic's "Value error, " prefix."""
    if error["type"] == "literal_error":
        # pydantic words the choices as "'a', 'b' or 'c'"
        choices = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))
        given = str(error.get("input"))
        close = difflib.get_close_matches(given, choices, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"{given!r} is not one of {', '.join(choices)}{hint}"
    return str(error["msg"]).removeprefix("Value error, ")


def field_errors(
    model: type[BaseModel], exc: ValidationError, name: Callable[[str], str] = str
) -> dict[str, str]:
    """Each field's first problem ("" for the model as a whole), a misspelt field naming the closest
    known one. `name` shows a field (the CLI shows its flag)."""
    found: dict[str, str] = {}
    for e in exc.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        text = _message(e)
        if e["type"] == "extra_forbidden":
            close = closest_field(model, field)
            text += (
                f" (did you mean {name(close)}?)" if close else f" (known: {', '.join(model.model_fields)})"
            )
        found.setdefault(field, text)
    return found


def describe_errors(model: type[BaseModel], exc: ValidationError, name: Callable[[str], str] = str) -> str:
    """A ValidationError as one line, ``field: message; ...``: what the API, the form, ``jobs submit
    -p`` and the CLI all say."""
    found = field_errors(model, exc, name)
    return "; ".join(f"{name(field) if field else 'params'}: {text}" for field, text in found.items())


class JobParams(BaseModel):
    """Base of every kind's parameters: unknown keys are refused; paths are declared once."""

    model_config = ConfigDict(extra="forbid")
    input_paths: ClassVar[tuple[str, ...]] = ()  # must exist (inside the roots, on the server)
    output_paths: ClassVar[tuple[str, ...]] = ()  # may not exist yet (inside the roots, on the server)
    # A kind whose run picks up what an earlier attempt left in `out` (train resumes from the last
    # checkpoint): a retry of a job that had no `out` is pointed at the failed attempt's folder.
    resumes_in_out: ClassVar[bool] = False
    # What the New-job form shows up front besides the required fields and the outputs; the rest
    # (policies, limits, tuning) waits under "Advanced".
    essentials: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def path_fields(cls) -> tuple[str, ...]:
        return cls.input_paths + cls.output_paths

    @field_validator("*", mode="before")
    @classmethod
    def _pairs_are_a_mapping(cls, value: Any, info: ValidationInfo) -> Any:
        """A mapping field (template kwargs) takes KEY=VALUE pairs, in one syntax wherever it is given:
        the CLI's repeated ``-k KEY=VALUE``, the form's lines, ``jobs submit -p template_kwargs=K=V``,
        or the API's JSON object."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _is_dict(field.annotation):
            return parse_pairs(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_path_is_a_list(cls, data: Any) -> Any:
        """A list field given one string (`-p inputs=FILE`, a form field) holds that one path."""
        if isinstance(data, dict):
            for name in cls.path_fields():
                field = cls.model_fields.get(name)
                value = data.get(name)
                # Python callers pass Path objects: a path field holds their text
                if isinstance(value, os.PathLike):
                    value = os.fspath(value)
                    data = {**data, name: value}
                elif isinstance(value, list | tuple):
                    value = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
                    data = {**data, name: value}
                if field is not None and _is_list(field.annotation) and isinstance(value, str):
                    data = {**data, name: [value]}
        return data

    @field_validator("columns", "tags", check_fields=False)
    @classmethod
    def _mapping_can_read(cls, value: Any, info: ValidationInfo) -> Any:
        """A declared column mapping (draftdeck.formats.columns) is checked where it is given, each
        error on its own field, so the form, the API and the CLI refuse one that cannot read any row
        before a job starts (columns come before tags in every kind)."""
        if info.field_name == "columns":
            check_columns(value)
        else:
            check_tags(value, info.data.get("columns") or {})
        return value

    @model_validator(mode="after")
    def _paths_are_text(self) -> Self:
        """Paths no filesystem call can take (NUL, a lone surrogate, a name over 255 bytes, a path
        over 4095) are refused here, with the field's name, by the one check every path passes."""
        for name in self.path_fields():
            for value in self.paths_of(name):
                try:
                    check_path_text(value)
                except PathNotAllowedError as exc:
                    raise ValueError(f"{name}: {exc}") from None
        return self

    def paths_of(self, name: str) -> list[str]:
        value = getattr(self, name)
        if value is None:
            return []
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]

    def confined(self, roots: list[Path], *, here: bool = True) -> Self:
        """A copy whose paths are resolved inside `roots` (raises PathNotAllowedError): the server's
        sandbox for everything that arrives over HTTP. `here=False`: the paths are another machine's (a
        run that reports from elsewhere), confined the same but not looked for on this one."""
        return self._map_paths(
            lambda value, must_exist: resolve_in_roots(value, roots, must_exist=must_exist and here)
        )

    def absolute(self) -> Self:
        """A copy whose paths are absolute by the same rule as :meth:`confined`, with no sandbox:
        what the in-process CLI runs, so that its summaries say where each output went."""
        return self._map_paths(lambda value, must_exist: resolve_user_path(value))

    def _map_paths(self, resolve: Callable[[str, bool], Path]) -> Self:
        updates: dict[str, Any] = {}
        for names, must_exist in ((self.input_paths, True), (self.output_paths, False)):
            for name in names:
                value = getattr(self, name)
                if isinstance(value, list):
                    updates[name] = [str(resolve(v, must_exist)) for v in value]
                elif value is not None:
                    updates[name] = str(resolve(value, must_exist))
        return self.model_copy(update=updates)

    def check(self, roots: list[Path]) -> None:
        """Refuse, before anything runs, what no run of this kind could do safely (UsageError)."""

    def policy(self) -> Policy:
        return Policy()


def parse_pairs(value: Any) -> Any:
    """KEY=VALUE pairs (a list of them, or text with one a line) as a mapping; VALUE is JSON when it
    parses (``true``, ``3``, ``"x"``), else the plain text. A mapping is kept as it is; anything else
    is left for the field's own type check. The only parser of this syntax."""
    if isinstance(value, str):
        items = value.splitlines()
    elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        return value
    out: dict[str, Any] = {}
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"takes KEY=VALUE pairs (e.g. enable_thinking=false), got {item!r}")
        try:
            out[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            out[key.strip()] = text.strip()
    return out


def _is_dict(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict or any(
        typing.get_origin(a) is dict for a in typing.get_args(annotation)
    )


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(typing.get_origin(a) is list for a in typing.get_args(annotation))


def build_options(cls: type[Any], params: JobParams, **extra: Any) -> Any:
    """The core's options dataclass `cls` from `params`: every field the two share, by name (path
    fields become `Path`), plus `extra` for what the options hold that the parameters do not."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {name: getattr(params, name) for name in type(params).model_fields if name in names}
    for name in params.path_fields():
        if name in values and values[name] is not None and not isinstance(values[name], list):
            values[name] = Path(values[name])
    return cls(**{**values, **extra})
