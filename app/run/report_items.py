"""What a report from a run launched elsewhere may hold (app/run/external.py), checked field by field
before anything is stored: a mistyped item is answered 422 naming the field, and nothing is kept that a
page could not show. The reporter that writes these items is draftdeck/drafter/train/reporter.py.

Numbers are bounded where they are stored: counts and steps by 2^53 (what JSON and the page's charts hold
exactly; the SQL columns are 64-bit), times by the year 2100, metric values finite or null (null: a
diverged loss, stored flagged). Texts are bounded too, and a mirrored file must be the JSON object the
run page reads.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from app.store.metrics import MAX_NAME
from draftdeck.drafter.train.reporter import MAX_BATCH_ITEMS, MAX_MESSAGE_CHARS, MAX_MIRRORED_BYTES, MIRRORED

MAX_COUNT = 2**53
MAX_EPOCH_SECONDS = 4_102_444_800.0  # 2100-01-01
MAX_MESSAGE = MAX_MESSAGE_CHARS
MAX_VALUES = 512  # metric names in one item (a run logs a few dozen)

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Message = Annotated[str, Field(max_length=MAX_MESSAGE)]
Code = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]
Value = Annotated[float, Field(allow_inf_nan=False)]


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    seq: Positive
    at: Annotated[float, Field(ge=0, le=MAX_EPOCH_SECONDS, allow_inf_nan=False)] | None = None


class Progress(_Item):
    kind: Literal["progress"]
    done: Count
    total: Count | None = None
    unit: Annotated[str, StringConstraints(min_length=1, max_length=32)] = "rows"


class Event(_Item):
    kind: Literal["event"]
    level: Literal["info", "warning", "error"] = "info"
    message: Message = ""
    code: Code | None = None
    count: Positive = 1


class Metrics(_Item):
    kind: Literal["metrics"]
    step: Count
    values: Annotated[dict[MetricName, Value | None], Field(max_length=MAX_VALUES)] = {}
    tokens: Count | None = None


class Alert(_Item):
    kind: Literal["alert"]
    alert: Code
    message: Message


class File(_Item):
    kind: Literal["file"]
    name: Literal[MIRRORED]  # type: ignore[valid-type]
    text: Annotated[str, Field(max_length=MAX_MIRRORED_BYTES)]

    @field_validator("text")
    @classmethod
    def _an_object(cls, text: str) -> str:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            raise ValueError("not JSON: the run page reads it as a JSON object") from None
        if not isinstance(value, dict):
            raise ValueError(f"a JSON object expected (the run page reads one), not {type(value).__name__}")
        return text


class Example(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    file: Annotated[str, Field(max_length=4096)]
    line: Count | None = None
    reason: Message


class RunResult(BaseModel):
    """A train run's result as the job page shows it (draftdeck.drafter.train.run's report): its rows,
    the issues by code, the steps and the best checkpoint. The artifacts' paths are the run's machine's:
    none is kept (`outputs` is empty), `checkpoints` and `run` are text."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rows_in: Count
    rows_out: Count
    rows_expanded: Count = 0
    accounting: Message = ""
    rejected: dict[Code, Count] = {}
    merged: dict[Code, Count] = {}  # rows folded into another row's conversation (FOLDED codes)
    warnings: dict[Code, Count] = {}
    formats: dict[Code, Count] = {}
    counts: dict[Code, Count] = {}
    outputs: Annotated[list[Any], Field(max_length=0)] = []
    examples: dict[Code, Annotated[list[Example], Field(max_length=20)]] = {}
    train_rows: Count | None = None
    heldout_rows: Count | None = None
    steps: Count | None = None
    best_step: Count | None = None
    checkpoints: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=10_000)] = []
    run: Annotated[str, Field(max_length=4096)] | None = None


class End(_Item):
    kind: Literal["end"]
    status: Literal["succeeded", "failed", "cancelled"]
    message: Message = ""
    result: RunResult | None = None


ReportItem = Annotated[Progress | Event | Metrics | Alert | File | End, Field(discriminator="kind")]


class ExternalRun(BaseModel):
    """A train run launched outside the job system, registering to report here (app/run/external.py)."""

    model_config = ConfigDict(extra="forbid")

    key: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    params: dict[str, Any]
    host: Annotated[str, StringConstraints(min_length=1, max_length=255)] = "?"
    run_folder: Annotated[str, Field(max_length=4096)] = ""
    world: Annotated[int, Field(ge=1, le=1 << 20)] = 1


class Report(BaseModel):
    """One batch of a run's report: numbered items, applied once and in order."""

    model_config = ConfigDict(extra="forbid")

    items: Annotated[list[ReportItem], Field(max_length=MAX_BATCH_ITEMS)] = []


def shown_result(result: Any) -> tuple[dict[str, Any] | None, str | None]:
    """An external run's stored result as the job page may show it, or (None, why not): a result stored
    before reports were checked (or by hand) is named as such rather than breaking the page."""
    if result is None:
        return None, None
    try:
        RunResult.model_validate(result)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        return None, f"its reported result is not one this page can show ({problems})"
    return result, None
