"""Dataset rows and their alerts in SQL: written when a dataset is registered by path (a POST) or when
the job that made it succeeds, never by a page being read.

The job side calls :func:`found_in_outputs` before its success transaction (it reads the shards, which
is slow) and :func:`add_datasets` inside it (rows only, no commit), so a succeeded job, its outputs and
its datasets appear together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlmodel import Session, col, select

from app.store.models import Alert, Dataset, Job
from draftdeck.browse.info import alerts_for, load_info
from draftdeck.dataset_alerts import DatasetAlert


@dataclass(frozen=True)
class FoundDataset:
    path: Path  # resolved
    alerts: tuple[DatasetAlert, ...]


def dataset_folder(path: Path) -> Path | None:
    """The dataset folder an output path belongs to (the path itself or its parent), if any."""
    for candidate in (path, path.parent):
        if candidate.is_dir() and (
            (candidate / "manifest.json").exists() or (candidate / "state.json").exists()
        ):
            return candidate
    return None


# How far and how much of the data roots the datasets page looks through for dataset folders nobody
# registered (made by `draftdeck tokenize` in a terminal): a page load stays fast on a big tree.
UNREGISTERED_DEPTH = 4
UNREGISTERED_DIRS = 2000
_NOT_DATA = frozenset({"broker", "demo-worlds", "node_modules", "__pycache__"})


def unregistered_in(roots: Iterable[Path], known: Iterable[str | Path]) -> list[Path]:
    """Dataset folders (a shard manifest inside) under the data roots that are not registered,
    breadth first, at most UNREGISTERED_DEPTH folders down and UNREGISTERED_DIRS folders in all;
    hidden folders and DraftDeck's own state (broker, demo worlds) are not looked into."""
    seen = {Path(k).resolve() for k in known}
    found: list[Path] = []
    queue = [(Path(r), 0) for r in roots]
    visited = 0
    while queue and visited < UNREGISTERED_DIRS:
        folder, depth = queue.pop(0)
        visited += 1
        try:
            children = sorted(c for c in folder.iterdir() if c.is_dir() and not c.is_symlink())
        except OSError:
            continue
        if (folder / "manifest.json").is_file() and folder.resolve() not in seen:
            found.append(folder.resolve())
            continue  # a dataset's own subfolders are its shards
        if depth < UNREGISTERED_DEPTH:
            queue.extend(
                (c, depth + 1) for c in children if not c.name.startswith(".") and c.name not in _NOT_DATA
            )
    return found


def found_at(folder: Path) -> FoundDataset:
    resolved = folder.resolve()
    return FoundDataset(resolved, tuple(alerts_for(load_info(resolved))))


def found_in_outputs(output_paths: Iterable[str | Path]) -> list[FoundDataset]:
    """The dataset folders a job's outputs (shard files) belong to, each once, with their alerts."""
    folders: dict[Path, None] = {}
    for p in output_paths:
        folder = dataset_folder(Path(p))
        if folder is not None:
            folders.setdefault(folder.resolve(), None)
    return [found_at(f) for f in folders]


# Folder names that say nothing about the data (a job's default output folder is "dataset"): a dataset
# in one is named after the job and its input instead, so the list is not a column of "dataset".
GENERIC_NAMES = frozenset({"dataset", "datasets", "out", "output", "outputs", "data", "shards", "tokenized"})


def dataset_name(session: Session, folder: Path, job_id: int | None) -> str:
    """The output folder's name; in a generic folder, "<first input's stem>-job<id>" for a job's
    dataset and "<parent>-<folder>" for a registered one."""
    if folder.name.lower() not in GENERIC_NAMES:
        return folder.name
    job = session.get(Job, job_id) if job_id is not None else None
    if job is not None:
        inputs = job.params.get("inputs") or []
        first = inputs[0] if isinstance(inputs, list) and inputs else inputs
        stem = Path(str(first)).name.split(".")[0] if first else job.kind
        return f"{stem}-job{job_id}"
    return f"{folder.parent.name}-{folder.name}" if folder.parent.name else folder.name


def add_datasets(session: Session, found: Iterable[FoundDataset], *, job_id: int | None) -> list[Dataset]:
    """Add a Dataset row (and its alerts, once per kind) for each folder not registered yet. No commit:
    the caller's transaction decides. Returns the rows, new or existing."""
    out = []
    for f in found:
        existing = session.exec(select(Dataset).where(Dataset.path == str(f.path))).first()
        if existing is not None:
            out.append(existing)
            continue
        ds = Dataset(
            path=str(f.path),
            name=dataset_name(session, f.path, job_id),
            job_id=job_id,
            origin="job" if job_id else "registered",
        )
        session.add(ds)
        raised = set(session.exec(select(Alert.kind).where(col(Alert.dataset) == ds.path)).all())
        for alert in f.alerts:
            if alert.kind not in raised:
                raised.add(alert.kind)
                session.add(Alert(kind=alert.kind, message=alert.message, job_id=job_id, dataset=ds.path))
        out.append(ds)
    session.flush()
    return out
