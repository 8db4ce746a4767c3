"""Typer parameters derived from a job kind's parameter model: one definition, no copies.

Each field becomes an option named after it (``max_row_bytes`` -> ``--max-row-bytes``) with its type,
default, bounds and help (the Field's description); `inputs` becomes the positional arguments; a
Literal becomes a choice; a dict becomes a repeated ``KEY=VALUE`` option (parsed by the model, as the
form's and the API's: :func:`draftdeck.jobs.params.parse_pairs`). Path fields take any path the user
can read: the data-root sandbox is the server's.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import annotated_types
import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from typer.core import TyperCommand

from draftdeck.errors import UsageError
from draftdeck.jobs.params import JobParams, describe_errors

ARGUMENT = "inputs"


def _bounds(info: FieldInfo, is_int: bool) -> dict[str, Any]:
    bounds: dict[str, Any] = {}
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            bounds["min"] = m.ge
        elif isinstance(m, annotated_types.Gt):
            bounds["min"] = m.gt + 1 if is_int else m.gt  # type: ignore[operator]
        elif isinstance(m, annotated_types.Le):
            bounds["max"] = m.le
        elif isinstance(m, annotated_types.Lt):
            bounds["max"] = m.lt - 1 if is_int else m.lt  # type: ignore[operator]
    return bounds


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the type without `| None`, whether None was allowed)."""
    args = typing.get_args(annotation)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return annotation, False


LONGEST_CHOICES = 40  # characters of `a|b|c`: past this an option's choices go into its help text


def _metavar(base: Any, is_path: bool) -> str:
    """Plain words for the value an option takes (Typer's own are ``<int range>``, ``<bool>``, ...)."""
    if is_path:
        return "PATH"
    return {int: "N", float: "X"}.get(base, "TEXT")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _flag_of(model: type[JobParams], name: str) -> str:
    """The option a field is typed as (its declared ``cli_flag``: --from for from_format)."""
    info = model.model_fields.get(name)
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    return str(extra.get("cli_flag") or _flag(name))


def model_parameters(
    model: type[JobParams], *, required: Iterable[str] = (), exclude: Iterable[str] = ()
) -> list[inspect.Parameter]:
    """One Typer parameter per field of `model` (`required` names optional fields the command needs)."""
    needed, skipped = set(required), set(exclude)
    params: list[inspect.Parameter] = []
    for name, info in model.model_fields.items():
        if name in skipped:
            continue
        base, optional = _base_type(info.annotation)
        is_path = name in model.path_fields()
        origin = typing.get_origin(base)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        flag = _flag_of(model, name)  # a list option reads better singular: --endpoint
        if base is bool and info.get_default(call_default_factory=True) is True:
            flag = f"{flag}/--no-{flag[2:]}"  # --reasoning/--no-reasoning: a flag that is on must turn off
        decls = [flag] + ([str(extra["cli_short"])] if "cli_short" in extra else [])
        help_ = info.description or ""
        kwargs: dict[str, Any] = {"help": help_}
        if origin is typing.Literal:
            # Text that the model checks, so that a wrong choice reads as it does in the form and the
            # API (the choices and the closest one), not as Typer's "Value error, ..."
            hint: Any = str
            choices = [str(c) for c in typing.get_args(base)]
            if len("|".join(choices)) > LONGEST_CHOICES:  # would overflow 80 columns: name them in the help
                kwargs["metavar"] = name.rsplit("_", 1)[-1].upper()  # from_format: FORMAT
                kwargs["help"] = f"{help_} (one of: {', '.join(choices)})"
            else:
                kwargs["metavar"] = "[" + "|".join(choices) + "]"
        elif origin is dict:
            hint = list[str]
            kwargs["metavar"] = "KEY=VALUE"
        elif origin is list:
            hint = list[Path] if is_path else list[str]
            kwargs["metavar"] = "PATH" if is_path else "TEXT"
        else:
            hint = Path if is_path else base
            kwargs.update(_bounds(info, base is int))
            if base is not bool:
                kwargs["metavar"] = _metavar(base, is_path)
        if optional and origin is not dict:
            hint = hint | None
        if name == ARGUMENT:
            marker: Any = typer.Argument(help=help_, metavar="INPUT")
            default: Any = inspect.Parameter.empty
            if not info.is_required():  # another option may stand in for it (eval's --suite)
                hint, default = hint | None, None
        else:
            marker = typer.Option(*decls, **kwargs)
            if info.is_required() or name in needed:
                default = inspect.Parameter.empty
            elif origin is dict:
                default = None
                hint = list[str] | None
            else:
                default = info.get_default(call_default_factory=True)
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                              annotation=Annotated[hint, marker])
        )  # fmt: skip
    return params


def params_from(model: type[JobParams], values: dict[str, Any]) -> JobParams:
    """Validate what Typer parsed as `model` (raises UsageError naming each bad option)."""
    data: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name not in values:
            continue
        value = values[name]
        if value is None and name == ARGUMENT:
            continue  # not given: the model's default
        if typing.get_origin(_base_type(info.annotation)[0]) is dict:
            value = value or []  # KEY=VALUE pairs: the model parses them (draftdeck.jobs.params.parse_pairs)
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, list):
            value = [str(v) for v in value]
        data[name] = value
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UsageError(describe_errors(model, exc, lambda name: _flag_of(model, name))) from None


def job_command(
    model: type[JobParams],
    body: Callable[..., None],
    *,
    doc: str,
    required: Iterable[str] = (),
    exclude: Iterable[str] = (),
    extra: Iterable[inspect.Parameter] = (),
) -> Callable[..., None]:
    """A Typer command taking `model`'s fields (plus the CLI-only `extra` parameters, such as
    ``--report``) that calls ``body(params, **extra_values)`` with the validated parameters."""
    fields = model_parameters(model, required=required, exclude=exclude)
    extras = list(extra)
    field_names = {p.name for p in fields}

    def command(**values: Any) -> None:
        from draftdeck.cli.common import usage_exit

        # Only what the user gave: the model fills its own defaults, so that its `model_fields_set`
        # tells an option the user set from one left alone (a cached train run's truth_rows)
        source = values.pop(CONTEXT).get_parameter_source
        given = {k: v for k, v in values.items() if k in field_names and _given(source(k))}
        try:
            # Absolute by the one path rule (draftdeck/paths.py), so every summary names where it wrote.
            params = params_from(model, given).absolute()
        except UsageError as exc:
            raise usage_exit(str(exc)) from None
        body(params, **{k: v for k, v in values.items() if k not in field_names})

    # Positional-or-keyword order does not matter to Typer; keyword-only keeps defaults free to mix.
    context = inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    command.__signature__ = inspect.Signature([*fields, *extras, context])  # type: ignore[attr-defined]
    command.__doc__ = doc
    return command


CONTEXT = "typer_context"  # the command's own parameter: Typer passes its context there


def _given(source: Any) -> bool:
    """Whether a parameter's value came from the command line (or the environment), not its default."""
    return source is not None and source.name != "DEFAULT"


def option(name: str, hint: Any, default: Any, *decls: str, **kwargs: Any) -> inspect.Parameter:
    """A CLI-only parameter for :func:`job_command`'s `extra`."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default,
        annotation=Annotated[hint, typer.Option(*(decls or (_flag(name),)), **kwargs)],
    )  # fmt: skip


class PlainCommand(TyperCommand):
    """Typer's command, its arguments shown by name alone ("INPUT", not "INPUT <list[Path]>"): their
    help says what they are, as options show plain value names."""

    def format_options(self, ctx: Any, formatter: Any) -> None:  # Typer's own click types
        args, opts = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append((record[0].split(" <", 1)[0], record[1]))
            elif param.param_type_name == "option":
                opts.append(record)
        for title, rows in (("Arguments", args), ("Options", opts)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def plain_help(app: typer.Typer) -> typer.Typer:
    """Give every option of `app` (and its sub-apps) a plain value name (``N``, ``X``, ``PATH``,
    ``TEXT``) where it declares none, instead of Typer's ``<int range>``, ``<path>``, ``<str>``; and show
    no default for a flag that is off (``[default: no-quick]`` only wraps mid-word). Call it once the
    commands are registered; choices keep their ``<a|b>``."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = PlainCommand
        if info.callback is not None:
            _plain_parameters(info.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            plain_help(group.typer_instance)
    return app


def _plain_parameters(callback: Callable[..., Any]) -> None:
    try:
        hints = typing.get_type_hints(callback, include_extras=True)
    except Exception:  # a signature built at run time (job_command) holds the objects already
        hints = {}
    if hints and any(isinstance(a, str) for a in getattr(callback, "__annotations__", {}).values()):
        # `from __future__ import annotations` keeps them as text, and each evaluation makes new
        # typer.Option objects: keep the evaluated ones, so that Typer reads the ones changed here
        callback.__annotations__ = dict(hints)
    for param in inspect.signature(callback).parameters.values():
        annotation, marker = hints.get(param.name, param.annotation), param.default
        hint = annotation
        if typing.get_origin(annotation) is Annotated:
            hint, *extras = typing.get_args(annotation)
            marker = next((e for e in extras if isinstance(e, typer.models.OptionInfo)), marker)
        if not isinstance(marker, typer.models.OptionInfo):
            continue
        base, _ = _base_type(hint)
        if typing.get_origin(base) is list:
            (base,) = typing.get_args(base)
        if base is bool:
            default = (
                param.default if not isinstance(param.default, typer.models.OptionInfo) else marker.default
            )
            if default is False:
                marker.show_default = False
        elif marker.metavar is None and base in (int, float, str, Path):
            marker.metavar = _metavar(base, base is Path)
