"""The `sweep` job's parameters: a drafter checkpoint, a grid of eval options and the eval options every
point shares, each as the `eval` job takes it.

The model is derived from :class:`EvalParams`, not copied: every eval option is an option of the sweep
(renamed where the sweep's own fields take its name: the prompts are `--prompts`, the checkpoint is the
positional argument), and a grid parameter is any scalar EvalParams field, its values checked by
EvalParams' own validation. An option added to the eval is an option and a grid parameter of the sweep
the moment it lands.
"""

from __future__ import annotations

import itertools
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self, cast

from pydantic import Field, TypeAdapter, ValidationError, create_model, model_validator
from pydantic.fields import FieldInfo

from draftdeck.drafter.eval.params import EvalParams
from draftdeck.jobs.params import JobParams, describe_errors

# Eval fields the sweep fills itself (the checkpoint, each point's out folder) or cannot sweep: a served
# comparison talks to one server launched with one setting, not one per point.
OWN = ("checkpoint", "out")
NOT_SWEPT_PREFIX = "served_"
NONE_WORDS = ("none", "null")  # a grid value meaning "not set" (the drafter's own block size)
MAX_POINTS = 256
TREE_SHAPE = ("tree_topk", "tree_depth")  # a tree's shape beside its budget: nothing to a chain


def _scalar(annotation: Any) -> bool:
    """int, float, str, bool or a Literal of them, optionally `| None`."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return len(args) == 1 and _scalar(args[0])
    return annotation in (int, float, str, bool) or typing.get_origin(annotation) is Literal


def sweepable() -> list[str]:
    """The eval options a grid may vary: EvalParams' scalar fields but paths, the served comparison's and
    `baselines` (a sweep's own setting, off by default: its points are compared with each other)."""
    paths = set(EvalParams.path_fields())
    return [
        name for name, info in EvalParams.model_fields.items()
        if _scalar(info.annotation) and name not in paths and name not in OWN and name != "baselines"
        and not name.startswith(NOT_SWEPT_PREFIX)
    ]  # fmt: skip


class SweepBase(JobParams):
    """The sweep's own fields; the shared eval options are added from EvalParams (`SweepParams`)."""

    inputs: list[str] = Field(
        min_length=1,
        max_length=1,
        description="The drafter checkpoint folder (or a train run folder: its best checkpoint).",
    )
    grid: list[str] = Field(
        min_length=1,
        description="PARAM=V1,V2,...: an eval option and its values (the option repeated for more"
        " parameters); every combination is evaluated on the same prompts. `none` unsets an option that"
        " may be unset (block_size: the drafter's own).",
    )
    out: str | None = Field(
        default=None, description="Folder for sweep.json and each point's eval.json (points/N/)."
    )

    input_paths: ClassVar[tuple[str, ...]] = ("inputs", "target", "prompts")
    output_paths: ClassVar[tuple[str, ...]] = ("out",)
    essentials: ClassVar[tuple[str, ...]] = ("grid", "prompts", "suites", "mode", "max_prompts",
                                             "max_new_tokens")  # fmt: skip

    def shared(self) -> dict[str, Any]:
        """The eval options every point shares, named as EvalParams names them."""
        data = self.model_dump(exclude={"inputs", "grid", "out", "prompts"}, exclude_unset=True)
        data["baselines"] = getattr(self, "baselines", False)  # the sweep's own default, not the eval's
        return {**data, "inputs": list(getattr(self, "prompts", [])), "checkpoint": self.inputs[0]}

    def axes(self) -> dict[str, list[Any]]:
        """The grid as {parameter: its typed values}, in the order given; refused by name before work."""
        return parse_grid(self.grid, self.shared())

    def points(self) -> list[dict[str, Any]]:
        """Every combination of the grid's values (the first parameter varies slowest). With tree_budget
        on the grid, a chain (budget 0) has no tree to shape: its points leave the tree's top-k and depth
        unset and are one point, so chains and trees sweep in one grid (tree_budget=0,16 x tree_topk=2,4:
        one chain, two trees)."""
        axes = self.axes()
        combos = [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]
        if "tree_budget" not in axes:
            return combos
        points: list[dict[str, Any]] = []
        for point in combos:
            if point["tree_budget"] == 0:
                point = {k: None if k in TREE_SHAPE else v for k, v in point.items()}
            if point not in points:
                points.append(point)
        return points

    def point_params(self, point: dict[str, Any], out: Path | None = None) -> EvalParams:
        return EvalParams(**{**self.shared(), **point, "out": str(out) if out else None})

    def _map_paths(self, resolve: Callable[[str, bool], Path]) -> Self:
        """A suite that is a user's file is confined to the data roots as the eval confines it."""
        mapped = super()._map_paths(resolve)
        if not getattr(self, "suites", None):
            return mapped
        return mapped.model_copy(update={"suites": self.point_params({})._map_paths(resolve).suites})

    @model_validator(mode="after")
    def _every_point_is_an_eval(self) -> Self:
        points = self.points()
        if len(points) > MAX_POINTS:
            raise ValueError(f"grid: {len(points)} points, more than {MAX_POINTS}; sweep fewer values")
        for point in points:  # a combination the eval refuses (temperature in greedy mode) is named
            try:
                self.point_params(point)
            except ValidationError as e:
                raise ValueError(f"grid point {_label(point)}: {describe_errors(EvalParams, e)}") from None
        return self


def _label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def parse_grid(grid: list[str], shared: dict[str, Any]) -> dict[str, list[Any]]:
    """`PARAM=V1,V2,...` strings as typed values, each typed and bounded by its EvalParams field (the
    combinations are checked whole, per point, by `_every_point_is_an_eval`)."""
    allowed = sweepable()
    axes: dict[str, list[Any]] = {}
    for entry in grid:
        name, eq, values = entry.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or not values.strip():
            raise ValueError(f"grid {entry!r}: write PARAM=V1,V2,... (e.g. block_size=4,8)")
        if name not in allowed:
            raise ValueError(f"grid {entry!r}: {name!r} is not a sweepable eval option; sweepable: "
                             + ", ".join(allowed))  # fmt: skip
        if name in axes:
            raise ValueError(f"grid: {name} is given twice; give all its values in one PARAM=V1,V2")
        default = EvalParams.model_fields[name].get_default(call_default_factory=True)
        if shared.get(name, default) != default:  # the CLI passes every option, a default one too
            raise ValueError(f"grid: {name} is also given as an option; give it in the grid only")
        typed = [_typed(name, v.strip()) for v in values.split(",")]
        if len(set(map(repr, typed))) < len(typed):
            raise ValueError(f"grid {entry!r}: a value is repeated")
        axes[name] = typed
    return axes


def _typed(name: str, text: str) -> Any:
    """One grid value as its EvalParams field types and bounds it (a combination is checked per point)."""
    info = EvalParams.model_fields[name]
    value: Any = None if text.lower() in NONE_WORDS else text
    try:
        return TypeAdapter(cast(Any, Annotated[info.annotation, info])).validate_python(value)
    except ValidationError as e:
        raise ValueError(f"grid {name}={text}: {e.errors()[0]['msg']}") from None


def _renamed(info: FieldInfo, flag: str, description: str) -> FieldInfo:
    extra = dict(info.json_schema_extra) if isinstance(info.json_schema_extra, dict) else {}
    return FieldInfo.merge_field_infos(
        info, json_schema_extra={**extra, "cli_flag": flag}, description=description
    )


def _sweep_params() -> type[SweepBase]:
    fields: dict[str, Any] = {}
    for name, info in EvalParams.model_fields.items():
        if name in OWN or name.startswith(NOT_SWEPT_PREFIX):
            continue
        if name == "inputs":  # the positional argument is the checkpoint: the prompts take --prompts
            said = (
                "The prompts every point decodes, as eval takes them: a JSONL file of OpenAI `messages`"
                " rows, or a tokenized dataset folder (its held-out split). Not with --suite."
            )
            fields["prompts"] = (info.annotation, _renamed(info, "--prompts", said))
        elif name == "baselines":  # a sweep compares its points: the floors, a third of its work, are off
            fields[name] = (info.annotation, FieldInfo.merge_field_infos(info, default=False))
        else:
            fields[name] = (info.annotation, info)
    model: type[SweepBase] = create_model(
        "SweepParams",
        __base__=SweepBase,
        __doc__="Evaluate a drafter at every point of a grid of eval options; chart tau against speed.",
        __module__=__name__,
        **fields,
    )
    return model


SweepParams = _sweep_params()
