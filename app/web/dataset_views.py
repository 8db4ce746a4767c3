"""What the dataset pages show beyond one shard read: a dataset's alerts, the row the other side of a
comparison pairs with, whether a dataset's files may be deleted. Routes are in app/web/datasets.py;
rows, tokens and statistics come from draftdeck/browse/."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, or_, select

from app.settings import Settings
from app.store.models import Alert, Dataset
from draftdeck.browse.info import (
    DatasetInfo,
)
from draftdeck.browse.loading import open_store
from draftdeck.browse.sample import RowKey, find_row, read_sample
from draftdeck.errors import PathNotAllowedError
from draftdeck.paths import resolve_in_roots


def concerns_dataset(alert: Alert, ds: Dataset) -> bool:
    """An alert is a dataset's when it names the dataset, or when the job that made it raised it."""
    return alert.dataset == ds.path or (ds.job_id is not None and alert.job_id == ds.job_id)


def dataset_alerts(session: Session, ds: Dataset) -> list[Alert]:
    named = col(Alert.dataset) == ds.path
    where = or_(named, col(Alert.job_id) == ds.job_id) if ds.job_id is not None else named
    query = select(Alert).where(where).order_by(col(Alert.acknowledged), col(Alert.id).desc())
    return list(session.exec(query).all())


def alerts_datasets(session: Session, alerts: Sequence[Alert]) -> dict[int, Dataset]:
    """The dataset each alert concerns (`concerns_dataset`), by alert id, for /alerts to link to: the
    dataset the alert names, else the one its job made (a tokenize job's high_truncation)."""
    paths = {a.dataset for a in alerts if a.dataset}
    jobs = {a.job_id for a in alerts if a.job_id is not None}
    if not (paths or jobs):
        return {}
    named_or_made = or_(col(Dataset.path).in_(paths), col(Dataset.job_id).in_(jobs))
    found = session.exec(select(Dataset).where(named_or_made).order_by(col(Dataset.id))).all()
    by_path = {ds.path: ds for ds in found}
    by_job: dict[int, Dataset] = {}
    for ds in found:
        if ds.job_id is not None:
            by_job.setdefault(ds.job_id, ds)  # a job that made several: its first
    out: dict[int, Dataset] = {}
    for a in alerts:
        concerned = by_path.get(a.dataset or "") or (by_job.get(a.job_id) if a.job_id is not None else None)
        if concerned is not None and a.id is not None:
            out[a.id] = concerned
    return out


def source_place(source: Any, index: Any, roots: Sequence[Path] | None = None) -> str:
    """Where a dataset row came from, in the notation of every message (``file:line`` for JSONL,
    ``file[record]`` otherwise), read from the file's shape when it lies inside the data roots."""
    from app.settings import get_settings
    from draftdeck.browse.source import source_where

    try:
        path = resolve_in_roots(str(source), list(roots if roots is not None else get_settings().roots))
    except PathNotAllowedError:
        return f"{Path(str(source)).name}, row {index}"
    return source_where(path, int(index))


def compared_row(
    info: DatasetInfo, n: int, key: RowKey | None, *, first: bool, roots: Sequence[Path]
) -> dict[str, Any]:
    """The first side shows row n; the other the row made from the same conversation (source file,
    row in it, turn), wherever the other dataset holds it, so filtered or reordered datasets line up.
    Without a source on the first side, rows are paired by number, and the page says so."""
    if first or key is None:
        sample = read_sample(info, n, roots=roots)
        how = "by row number: the first dataset does not record each row's source" if not first else None
        return {"sample": sample, "matched": how}
    store = open_store(info.path)
    sources = store.column("source")
    if sources is None or sources.null_count == len(sources):
        return {
            "sample": read_sample(info, n, roots=roots),
            "matched": "by row number: this dataset does not record sources",
        }
    found = find_row(store, key)
    source, source_row, turn = key
    # -1: the row trains on every assistant turn
    shown_turn = f", assistant turn {turn}" if turn is not None and turn >= 0 else ""
    where = f"{source_place(source, source_row, roots)}{shown_turn}"
    if found is None:
        return {"sample": None, "message": f"no row of this dataset comes from {where}"}
    sample = read_sample(info, found, roots=roots)
    return {"sample": sample, "matched": f"row {found} here comes from {where}"}


def deletable(ds: Dataset, settings: Settings) -> tuple[bool, str]:
    """Whether the files may be deleted: only a directory strictly inside a data root."""
    try:
        resolved = resolve_in_roots(ds.path, settings.roots)
    except PathNotAllowedError as exc:
        return False, str(exc)
    roots = [Path(r).resolve() for r in settings.roots]
    if any(root == resolved or root.is_relative_to(resolved) for root in roots):
        return False, f"{resolved} is (or holds) a data root; it is never deleted"
    if not resolved.is_dir():
        return False, f"{resolved} is no longer on disk"
    if not ((resolved / "manifest.json").exists() or (resolved / "state.json").exists()):
        return False, f"{resolved} no longer looks like a dataset folder (no manifest.json or state.json)"
    return True, str(resolved)
