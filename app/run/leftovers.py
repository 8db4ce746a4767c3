"""What a job that ended without succeeding leaves on disk, removed: chunk inputs and statistics,
chunk shards, and the hidden ``.tmp-<pid>-<name>`` files of a writer that died before its rename
(draftdeck/fileio.py). Called on every failure path: an error, a cancel, a lost worker.

A failed chunked job's done chunks are not partial: app/run/chunks.py's cleanup first moves them into the
job's ``kept-chunks`` folder for a Retry (app/run/resume.py), which this module never touches.

Only files the job itself writes are touched: its own folder under the jobs folder, chunk shards
and temporaries inside a tokenize `out` folder (which must be empty when the job starts), and the
temporaries named after a convert `out` file beside it. Nothing recorded as an output of a succeeded
job is ever here: a failed job records no outputs.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from sqlmodel import Session

from app.settings import get_settings
from app.store import records
from draftdeck.kinds import get_kind
from draftdeck.shards.store import IMAGES_DIR, MANIFEST
from draftdeck.tokenize.chunks import shard_name

log = logging.getLogger(__name__)

PARTS = "chunks"  # chunk files and statistics, in the job's folder (app/run/chunks.py)
TMP = ".tmp-"


def remove_partial_files(session: Session, job_id: int) -> list[Path]:
    """Remove what job `job_id` wrote and never delivered; return the paths removed."""
    job = records.get_job(session, job_id)
    if job is None:
        return []
    removed: list[Path] = []
    job_dir = get_settings().jobs_dir / str(job_id)
    parts = job_dir / PARTS
    if parts.exists():
        shutil.rmtree(parts, ignore_errors=True)
        removed.append(parts)
    if job_dir.is_dir():
        removed += _unlink(p for p in job_dir.rglob(f"{TMP}*") if p.is_file())
    for out in _outputs(job.kind, job.params, job_dir):
        if out.is_dir():
            removed += _unlink(p for p in out.iterdir() if p.is_file() and _partial_in_folder(p.name))
            if (out / IMAGES_DIR).is_dir() and not (out / MANIFEST).exists():  # a tokenize job's pictures
                shutil.rmtree(out / IMAGES_DIR, ignore_errors=True)
                removed.append(out / IMAGES_DIR)
        elif out.parent.is_dir():
            removed += _unlink(out.parent.glob(f"{TMP}*-{out.name}"))
    if removed:
        log.info("job %s: removed %d partial files: %s", job_id, len(removed), [str(p) for p in removed[:5]])
    return removed


def _partial_in_folder(name: str) -> bool:
    # chunk-<index>.arrow: a chunk shard before the final step renames it (draftdeck/tokenize/chunks.py)
    return name.startswith(TMP) or (name.startswith("chunk-") and len(name) == len(shard_name(0)))


def _outputs(kind_name: str, raw: dict[str, object], job_dir: Path) -> list[Path]:
    try:
        kind = get_kind(kind_name)
        params = kind.params.model_validate(raw)
    except Exception:  # parameters of an older version: only the job's own folder is known
        log.warning("job of kind %s: parameters no longer valid; cleaning its folder only", kind_name)
        return []
    found: list[Path] = []
    for name in params.output_paths:
        found += [Path(p) for p in params.paths_of(name)]
    out_dir = getattr(params, "out_dir", None)
    if callable(out_dir):
        found.append(Path(out_dir(job_dir)))
    return found


def _unlink(paths: object) -> list[Path]:
    gone: list[Path] = []
    for p in paths:  # type: ignore[attr-defined]
        try:
            p.unlink()
            gone.append(p)
        except FileNotFoundError:
            continue
    return gone
