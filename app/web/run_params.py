"""The Parameters table of the run page and the compare view: what defines a run, one row a field, read
from its run.json (draftdeck.drafter.train.run_record.RunRecord) or, before the trainer wrote one, from the
train job's parameters.

The record's nested dicts (the drafter's config, the lr schedule, the data, the sharding) are broken out
into a row per field, named by their path (``drafter.block_size``, ``lr_schedule.lr``), so that a new field
is a new row without a line here. What the run produced (its progress, best step and checkpoint paths) and
what the page shows apart (truth, memory, provenance) are no parameters: never a row, so never a
difference. The fields a person compares runs by come first, the rest in the record's own order."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from app.store.run_figures import SHOWN_APART
from app.web.run_compare import drafter_kind
from draftdeck.drafter.kinds import Options

# where the run got to (RunRecord's progress fields) and, in a job's parameters before run.json, where it
# writes: outputs, not parameters (each run's own, so they would differ between any two)
OUTPUTS = frozenset({"steps_done", "best_step", "checkpoints", "out"})
# The fields compared first, in this order, by path (a job's flat parameters by their last name);
# KIND: the drafter kind's own options (draftdeck.drafter.kinds.DrafterKind.options), wherever recorded.
KIND = "<kind options>"
FIRST = (
    "drafter.kind", "drafter", "drafter.block_size", "drafter.layers", KIND,
    "loss", "gamma", "anchors_per_seq",
    "lr_schedule.lr", "lr_schedule.schedule", "lr_schedule.warmup_steps", "lr_schedule.min_lr_ratio",
    "lr_schedule.optimizer", "lr_schedule.weight_decay", "lr_schedule.clip",
    "lr_schedule.batch_size", "lr_schedule.grad_accum", "global_batch", "total_steps", "seq_length",
    "seed", "target", "inputs",
)  # fmt: skip
_RANK = {path: i for i, path in enumerate(FIRST)}
_LEAF_RANK = {path.rsplit(".", 1)[-1]: i for i, path in reversed(list(enumerate(FIRST)))}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def option_names(trains: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(the options of the drafter kind the train job of parameters `trains` trains, those of the
    other kinds only): a job's parameters hold every kind's, the others' unused defaults."""
    own = {name for group in drafter_kind(dict(trains)).options for name in group.model_fields}
    every = {name for group in Options.groups() for name in group.model_fields}
    return own, every - own


def _fields(
    value: Mapping[str, Any], prefix: str, above: dict[str, Any], others: set[str]
) -> Iterator[tuple[str, Any]]:
    """(path, value) of each leaf of `value`, dicts broken out, depth first in the record's order. A
    field that repeats, same name and value, one of a dict above it (data.inputs, the drafter's
    rope_parameters.rope_theta) is not listed again; another kind's option is not listed."""
    mine = {k: v for k, v in value.items() if not isinstance(v, Mapping)}
    for key, v in value.items():
        if key in others or (prefix and key in above and above[key] == v):
            continue
        path = f"{prefix}{key}"
        if isinstance(v, Mapping):
            yield from _fields(v, f"{path}.", above | mine, others)
        else:
            yield path, v


class Param(NamedTuple):
    path: str  # "drafter.block_size"
    value: Any
    rank: int  # its place in FIRST, len(FIRST) for the rest


def run_parameters(record: Mapping[str, Any], trains: Mapping[str, Any]) -> list[Param]:
    """The parameters of a run in the order the table lists them: `record` (run.json, or the job's
    parameters) less its outputs, what the page shows apart and other kinds' options, with the drafter's
    kind named where its config does not name it (DFlash's). `trains`: the job's parameters."""
    own, others = option_names(trains)
    shown = {k: v for k, v in record.items() if k not in OUTPUTS and k not in SHOWN_APART}
    drafter = shown.get("drafter")
    if isinstance(drafter, Mapping) and "kind" not in drafter:
        shown["drafter"] = {"kind": drafter_kind(dict(trains)).name, **drafter}

    def rank(path: str) -> int:
        leaf = path.rsplit(".", 1)[-1]
        first = _RANK.get(path, _LEAF_RANK.get(leaf) if "." not in path else None)
        if first is None and leaf in own:
            first = _RANK[KIND]
        return len(FIRST) if first is None else first

    params = [Param(path, v, rank(path)) for path, v in _fields(shown, "", {}, others)]
    return sorted(params, key=lambda p: p.rank)  # stable: the record's order within a rank


def param_table(columns: Sequence[Sequence[Param]]) -> list[dict[str, Any]]:
    """The table's rows over runs' `run_parameters`: {key, group, name, cells, differ, first}, a cell
    None where the run has no such field and otherwise {text, title}; `differ` where the runs' values
    are not all the same (a field one run lacks differs); `first` for a field compared first (FIRST).
    Rows in rank order; within a rank each run's order is kept, a field only a later run has after the
    one before it there."""
    values = [{p.path: p.value for p in column} for column in columns]
    ranks: dict[str, int] = {}
    merged: list[str] = []
    for column in columns:
        at = -1
        for p in column:
            ranks[p.path] = min(ranks.get(p.path, p.rank), p.rank)
            if p.path in merged:
                at = merged.index(p.path)
            else:
                at += 1
                merged.insert(at, p.path)
    rows = []
    for key in sorted(merged, key=ranks.__getitem__):
        seen = [json.dumps(c.get(key, "\0absent"), sort_keys=True, default=str) for c in values]
        group, _, name = key.rpartition(".")
        rows.append(
            {
                "key": key,
                "group": f"{group}." if group else "",
                "name": name,
                "cells": [_cell(c[key]) if key in c else None for c in values],
                "differ": len(set(seen)) > 1,
                "first": ranks[key] < len(FIRST),  # one of the fields compared first
            }
        )
    return rows


def _cell(value: Any) -> dict[str, str] | None:
    """A value as the table shows it: None (a dash) for no value; a SHA-256 cut to 12 digits, whole in
    its title."""
    if value is None or value == [] or value == "":
        return None
    values = value if isinstance(value, list) else [value]
    if values and all(isinstance(v, str) and _SHA256.match(v) for v in values):
        return {"text": ", ".join(f"{v[:12]}…" for v in values), "title": ", ".join(values)}
    return {"text": value_text(value), "title": ""}


def value_text(value: Any) -> str:
    """A value as a person reads it: a float in 6 significant digits, lists joined, true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple):
        return ", ".join(value_text(v) for v in value)
    if isinstance(value, Mapping):  # a mapping inside a list: not broken out
        return "; ".join(f"{k}={value_text(v)}" for k, v in value.items())
    return str(value)
