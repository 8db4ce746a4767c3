"""Alerts on a finished dataset: what a user must see about it (no rows, a 0-byte or unreadable shard,
rows without a trained token, heavy truncation), from facts counted off its manifest and shards."""

from __future__ import annotations

from dataclasses import dataclass

HIGH_TRUNCATION = (
    0.10  # alert when more than this fraction of a dataset's rows was cut at the sequence length
)

DATASET_ALERTS: dict[str, str] = {
    "empty_output": "the dataset has no rows: nothing to train on",
    "zero_byte_shard": "a shard file is 0 bytes",
    "unreadable_shard": "a shard cannot be read",
    "no_trained_tokens": "rows without a single trained token (the drafter learns nothing from them)",
    "high_truncation": f"more than {HIGH_TRUNCATION:.0%} of the rows were cut at the sequence length",
}


@dataclass(frozen=True)
class DatasetFacts:
    """What the dataset alert rules look at, counted from a dataset's manifest and shards."""

    name: str
    readable: bool  # the shards open
    rows: int
    zero_byte_shards: tuple[str, ...] = ()
    untrained_rows: int | None = None  # None: not counted (the columns could not be read)
    truncated_rows: int | None = None  # None: the dataset records no truncation
    unreadable: str | None = None  # why the columns could not be read


@dataclass(frozen=True)
class DatasetAlert:
    kind: str  # a key of DATASET_ALERTS
    message: str


def dataset_alerts(facts: DatasetFacts) -> list[DatasetAlert]:
    """Every problem a user must see about a dataset, one alert per kind."""
    out: list[DatasetAlert] = []
    name, rows = facts.name, facts.rows
    if facts.readable and rows == 0:
        out.append(DatasetAlert("empty_output", f"dataset {name} has no rows: nothing to train on"))
    for shard in facts.zero_byte_shards:
        out.append(DatasetAlert("zero_byte_shard", f"dataset {name}: shard {shard} is 0 bytes"))
    if not (facts.readable and rows):
        return out
    if facts.unreadable is not None:
        out.append(DatasetAlert("unreadable_shard", facts.unreadable))
        return out
    if facts.untrained_rows:
        untrained = f"dataset {name}: {facts.untrained_rows:,} of {rows:,} rows have no trained token"
        out.append(DatasetAlert("no_trained_tokens", untrained))
    cut = facts.truncated_rows
    if cut is not None and cut / rows > HIGH_TRUNCATION:
        out.append(DatasetAlert("high_truncation", f"dataset {name}: {cut:,} of {rows:,} rows "
                                f"({cut / rows:.0%}) were cut at the sequence length"))  # fmt: skip
    return out
